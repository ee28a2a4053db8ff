"""Decode attention on CPU: every request's one new token against its whole KV, for one batch.

`plan()` once per batch, `attend()` per layer. Two ways to read the KV:
  - the C++ kernel (`kernels/csrc/decode_attention.cpp`, when built): reads each request's K/V
    rows straight from the pool by slot, once for all query heads that share them (3x the speed
    of the torch way at 16 requests of 384 tokens, 4x at 1160);
  - the torch way: gather every request's KV into a padded [B, max_len] buffer, then one SDPA.
With `cascade`, rows that all share a long KV prefix attend to it once; their own tokens go either
way above, and the parts are merged by log-sum-exp: with the kernels all in C++
(`kernels/csrc/cascade_attention.cpp`), otherwise by torch ops (`kernels/cascade.py`). It sums in
another order than a row alone, so a row's result then depends on the rows batched with it: it
is off unless asked for (--enable-batch-variance).
"""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType

import torch
import torch.nn.functional as F

from kernels import cascade
from kernels.eager_attention import eager_attention
from kernels.kv_pool import KVPool

Gather = Callable[[int, torch.Tensor, str], tuple[torch.Tensor, torch.Tensor]]

# Cascade the shared prefix of a decode batch when at least (rows, shared KV tokens) share it.
# Measured a step, bf16, 2 cores. The torch way: B=8 with 256 shared 17.0 vs 18.9 ms, B=16 with
# 512 shared 24.6 vs 32.7 ms; not at B=4 or 128 shared. The kernels, per layer against each row
# reading the prefix whole (9 heads over 3 KV heads of 64): B=16 over 1024 shared and 128 own
# 336 vs 526 us, over 512 244 vs 343, B=32 over 1024 629 vs 1141; B=8 over 1024 even (209 vs
# 227), B=16 over 256 and B=4 lost (the prefix's tile has 48 query rows, 16 rows of 3 heads).
CASCADE_MIN = {"torch": (8, 256), "kernel": (16, 512)}
KERNEL_DTYPES = (torch.float32, torch.bfloat16)
KERNEL_HEAD_DIMS = (64, 128)  # and 1 to 8 query heads per KV head (decode_attention.cpp's instances)


def kernel_supports(dtype: torch.dtype, head_dim: int, group: int) -> bool:
    return dtype in KERNEL_DTYPES and head_dim in KERNEL_HEAD_DIMS and 1 <= group <= 8


class DecodeAttention:
    def __init__(self, pool: KVPool, num_heads: int, num_kv_heads: int, head_dim: int, gather: Gather,
                 kernels: ModuleType | None, cascade: bool = False, scale: float | None = None,
                 softcap: float | None = None) -> None:
        """`softcap`: scores capped before the softmax (Gemma 2), by the torch way only."""
        assert softcap is None or (kernels is None and not cascade), "soft-capping runs the torch way only"
        self.pool = pool
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.group = num_heads // num_kv_heads
        self.scale = scale if scale is not None else head_dim**-0.5
        self.softcap = softcap
        self.gather = gather
        self.kernels = kernels if kernel_supports(pool.dtype, head_dim, self.group) else None
        self.cascade = cascade
        self.shared_index: torch.Tensor | None = None  # KV slots every row shares (cascade)

    def plan(self, slots: torch.Tensor, seq_lens: list[int]) -> None:
        """`slots`: every row's KV slots, row after row (int64 [sum seq_lens])."""
        batch, max_len = len(seq_lens), max(seq_lens)
        device = slots.device
        valid = torch.arange(max_len, device=device)[None, :] < torch.tensor(seq_lens, device=device)[:, None]
        padded = torch.zeros((batch, max_len), dtype=torch.int64, device=device)
        padded[valid] = slots
        # Every row keeps its newest token (its own slot) out of the shared part.
        min_batch, min_shared = CASCADE_MIN["torch" if self.kernels is None else "kernel"]
        use_cascade = self.cascade and batch >= min_batch
        shared = cascade.common_prefix_len(padded, min(seq_lens) - 1) if use_cascade else 0
        self.shared_index = None
        own_lens = seq_lens
        if shared >= min_shared:
            self.shared_index = padded[0, :shared]
            padded, valid = padded[:, shared:].contiguous(), valid[:, shared:]
            own_lens = [n - shared for n in seq_lens]
            slots = padded[valid]
        if self.kernels is not None:
            self.slots = slots
            self.indptr = torch.tensor([0, *_cumsum(own_lens)], dtype=torch.int64, device=device)
            return
        self.padded_index = padded.reshape(-1)
        self.padded_len = padded.shape[1]
        self.mask = None  # not needed when every row has the same length
        if min(own_lens) != self.padded_len:
            mask = torch.zeros(valid.shape, dtype=self.pool.dtype, device=device)
            self.mask = mask.masked_fill_(~valid, float("-inf"))[:, None, None, :]

    def attend(self, layer_id: int, q: torch.Tensor) -> torch.Tensor:
        """q [B, num_heads, head_dim] -> [B, num_heads * head_dim]."""
        batch, d = q.shape[0], self.head_dim
        if self.shared_index is None:
            return self._own(layer_id, q, with_lse=False)[0].reshape(batch, self.num_heads * d)
        if self.kernels is not None and q.dtype == self.pool.dtype:
            return self.kernels.cascade_attention(
                q.contiguous(), self.pool.k[layer_id], self.pool.v[layer_id], self.shared_index, self.slots,
                self.indptr, self.scale).reshape(batch, self.num_heads * d)
        own, own_lse = self._own(layer_id, q, with_lse=True)
        assert own_lse is not None  # asked for
        shared, shared_lse = self._shared(layer_id, q)
        return cascade.merge(own, own_lse, shared, shared_lse).reshape(batch, self.num_heads * d)

    def _own(self, layer_id: int, q: torch.Tensor, with_lse: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Attention over each row's planned (own) tokens: ([B, kvh, group, d], lse [B, kvh, group])."""
        batch, kvh, d = q.shape[0], self.num_kv_heads, self.head_dim
        if self.kernels is not None and q.dtype == self.pool.dtype:
            out, lse = self.kernels.decode_attention(
                q.contiguous(), self.pool.k[layer_id], self.pool.v[layer_id], self.slots, self.indptr, self.scale)
            return out.view(batch, kvh, self.group, d), lse.view(batch, kvh, self.group)
        k_all, v_all = self.gather(layer_id, self.padded_index, "main")
        k_all = k_all.view(batch, self.padded_len, kvh, d).transpose(1, 2).to(q.dtype)
        v_all = v_all.view(batch, self.padded_len, kvh, d).transpose(1, 2).to(q.dtype)
        q_folded = q.view(batch, kvh, self.group, d)
        mask = None if self.mask is None else self.mask.to(q.dtype)
        if with_lse:
            return cascade.attend(q_folded, k_all, v_all, mask, self.scale)
        if self.softcap is not None:
            return eager_attention(q_folded, k_all, v_all, mask, self.scale, self.softcap), None
        return F.scaled_dot_product_attention(q_folded, k_all, v_all, attn_mask=mask, scale=self.scale), None

    def _shared(self, layer_id: int, q: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Every row of a KV head against the shared prefix at once, [1, kvh, batch * group, d]."""
        assert self.shared_index is not None
        batch, kvh, d = q.shape[0], self.num_kv_heads, self.head_dim
        k_p, v_p = self.gather(layer_id, self.shared_index, "shared")
        q_all = q.view(batch, kvh, self.group, d).transpose(0, 1).reshape(1, kvh, batch * self.group, d)
        k_p, v_p = (t.transpose(0, 1).unsqueeze(0).to(q.dtype) for t in (k_p, v_p))
        shared, lse = cascade.attend(q_all, k_p, v_p, None, self.scale)
        return shared.view(kvh, batch, self.group, d).transpose(0, 1), lse.view(kvh, batch, self.group).transpose(0, 1)


def _cumsum(lengths: list[int]) -> list[int]:
    out, total = [], 0
    for n in lengths:
        total += n
        out.append(total)
    return out
