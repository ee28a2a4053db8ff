"""Paged attention in plain torch: the CPU backend and the oracle for FlashInfer.

GQA folds the query heads that share a KV head into the query length
(q.view(..., kv_heads, group, head_dim)) and runs one scaled_dot_product_attention per call:
K/V heads are never repeated (15x slower on CPU) and `enable_gqa` is avoided (5x slower in bf16).

Decode rows (one new token per request) run together through `kernels/decode_attention.py` (our
C++ kernel when it is built, else one padded SDPA; a long KV prefix shared by every row attended
to once). Prefill rows run through our C++ prefill kernel (`kernels/csrc/prefill_attention.cpp`,
one call per layer for every request, straight from the pool) when it is built and has an
instance for the shapes; else one attention per request with an explicit causal mask offset by
the cached prefix length (SDPA in fp32; in bf16 two GEMMs and a softmax, which run far faster
there). A mixed batch (prefill chunks plus running decodes) does both.

`AttentionOptions` (kernels/base.py) add a softmax scale, a sliding window (decode rows get only
their last `window` slots, kernels/sliding_window.py; prefill rows are masked, in the C++ kernel
too) and soft-capping, which no fused kernel here does: a soft-capped backend runs every row on
the torch paths (kernels/eager_attention.py).
"""

from __future__ import annotations

from types import ModuleType

import torch
import torch.nn.functional as F

from kernels.base import AttentionBackend, AttentionOptions, DecodeKernelInputs, ForwardMetadata
from kernels.decode_attention import DecodeAttention, kernel_supports
from kernels.eager_attention import eager_attention
from kernels.kv_pool import KVPool
from kernels.sliding_window import last_keys, visible


def token_slots(meta: ForwardMetadata) -> torch.Tensor:
    """Expand page ids into the KV slot of every token, request after request (int64 [sum seq_lens])."""
    pages = meta.kv_indices.to(torch.int64)
    ps = meta.page_size
    if ps == 1:
        return pages
    slots = (pages[:, None] * ps + torch.arange(ps, device=pages.device)).reshape(-1)
    # Keep the first `seq_len` slots of each request's pages (its last page may be partial).
    keep = torch.zeros(len(slots), dtype=torch.bool, device=pages.device)
    page_ptr = meta.kv_indptr_host.tolist()  # host memory: no sync
    for i, seq_len in enumerate(meta.seq_lens):
        start = page_ptr[i] * ps
        keep[start : start + seq_len] = True
    return slots[keep]


DECODE_ROWS_EXTEND = 8  # generated extends of at most this many tokens attend as decode rows


class TorchAttentionBackend(AttentionBackend):
    """Paged prefill and decode attention over a `KVPool`, in plain torch."""

    def __init__(self, pool: KVPool, num_heads: int, num_kv_heads: int, head_dim: int,
                 kernels: ModuleType | None = None, cascade: bool = False,
                 options: AttentionOptions | None = None) -> None:
        """`kernels`: our built C++ CPU kernels (`runtime.execution.cpu_kernels`), or None for torch only.
        `cascade`: decode rows sharing a long KV prefix attend to it once (kernels/decode_attention.py).
        `options`: scale, window and soft cap (default: none)."""
        assert num_heads % num_kv_heads == 0, (num_heads, num_kv_heads)
        options = options or AttentionOptions()
        self.pool = pool
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.group = num_heads // num_kv_heads
        self.head_dim = head_dim
        self.scale = options.softmax_scale(head_dim)
        self.window, self.softcap = options.window, options.softcap
        if self.softcap is not None:  # no kernel here caps the scores; nor does the cascade's merge
            kernels, cascade = None, False
        self.meta: ForwardMetadata | None = None
        # Gathered K/V land in buffers reused by every layer and batch: fresh multi-MB tensors
        # per layer cost a page fault per 4 KiB on CPU, which dominated long-context decode.
        self._gather_bufs: dict[str, list[torch.Tensor]] = {}
        self.decoder = DecodeAttention(pool, num_heads, num_kv_heads, head_dim, self._gather, kernels, cascade,
                                       self.scale, self.softcap)
        # The prefill kernel has the decode kernel's instances (dtypes, head sizes, groups).
        self.extend_kernel = kernels if kernel_supports(pool.dtype, head_dim, self.group) else None

    def plan(self, meta: ForwardMetadata) -> None:
        self.meta = meta
        slots = token_slots(meta)
        self.decode = meta.is_decode
        if self.decode:
            self.decoder.plan(*last_keys(slots, meta.seq_lens, self.window))
            return
        # Mixed: the rows of short generated extends (decodes, speculative verify steps) attend as
        # decode rows together, row j of an n-token extend over the first seq_len - n + 1 + j
        # slots (with a window, the last `window` of them); their query rows are gathered, then
        # scattered. Prompt tokens always take the prefill path and generated ones the decode
        # path, however the batch is made up: the two kernels sum in different orders, so a row's
        # result would otherwise depend on how its prompt was chunked or what it was batched with.
        short = [i for i, n in enumerate(meta.extend_lens) if n <= DECODE_ROWS_EXTEND and meta.is_generated(i)]
        self.mixed_rows: torch.Tensor | None = None
        if short:
            kv_starts = _starts(meta.seq_lens)
            q_starts = _starts(meta.extend_lens)
            pieces, lens, rows = [], [], []
            for i in short:
                prefix = meta.seq_lens[i] - meta.extend_lens[i]
                for j in range(meta.extend_lens[i]):
                    end = kv_starts[i] + prefix + 1 + j
                    keys = prefix + 1 + j if self.window is None else min(prefix + 1 + j, self.window)
                    pieces.append(slots[end - keys : end])
                    lens.append(keys)
                    rows.append(q_starts[i] + j)
            self.decoder.plan(torch.cat(pieces), lens)
            self.mixed_rows = torch.tensor(rows, dtype=torch.int64, device=slots.device)
        self._plan_extend(slots, meta, skip=set(short) if self.mixed_rows is not None else set())

    def _plan_extend(self, slots: torch.Tensor, meta: ForwardMetadata, skip: set[int]) -> None:
        if self.extend_kernel is not None:
            # Requests in `skip` get no KV slots: the kernel leaves their rows alone.
            kv_lens = [0 if i in skip else n for i, n in enumerate(meta.seq_lens)]
            keep = [slots[s : s + n] for s, n in zip(_starts(meta.seq_lens), kv_lens) if n]
            self.kernel_slots = torch.cat(keep) if keep else slots[:0]
            self.q_indptr = torch.tensor([*_starts(meta.extend_lens), sum(meta.extend_lens)], dtype=torch.int64)
            self.kv_indptr = torch.tensor([*_starts(kv_lens), sum(kv_lens)], dtype=torch.int64)
            return
        # Per request not in `skip`: (query row range, KV slots of the keys its rows may see, mask,
        # how many of the mask's first columns every row sees).
        self.extend_plan: list[tuple[int, int, torch.Tensor, torch.Tensor | None, int]] = []
        q_start, kv_start = 0, 0
        device = slots.device
        for i, (seq_len, ext_len) in enumerate(zip(meta.seq_lens, meta.extend_lens)):
            if i in skip:
                q_start += ext_len
                kv_start += seq_len
                continue
            prefix_len = seq_len - ext_len
            # With a window, keys before the first row's window are left out.
            first = 0 if self.window is None else max(0, prefix_len + 1 - self.window)
            req_slots = slots[kv_start + first : kv_start + seq_len]
            q_pos = torch.arange(prefix_len, seq_len, device=device)
            allowed = visible(q_pos, torch.arange(first, seq_len, device=device), self.window)  # [ext, keys]
            # Folding repeats each query row once per head in the group: same mask per repeat.
            # NOTE: an additive float mask keeps SDPA on its flash kernel (a bool mask is slower).
            mask = None
            if ext_len > 1:
                mask = torch.zeros(allowed.shape, dtype=self.pool.dtype, device=device)
                mask.masked_fill_(~allowed, float("-inf"))
                mask = mask.repeat(self.group, 1)
            always = prefix_len if self.window is None else 0
            self.extend_plan.append((q_start, ext_len, req_slots, mask, always))
            q_start += ext_len
            kv_start += seq_len

    def decode_kernel_inputs(self) -> DecodeKernelInputs | None:
        decoder = self.decoder
        if not self.decode or decoder.kernels is None or self.softcap is not None:
            return None
        assert self.meta is not None
        return DecodeKernelInputs(self.meta.out_cache_loc, decoder.slots, decoder.indptr, decoder.shared_index,
                                  self.pool.k, self.pool.v)

    def forward(self, layer_id: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        meta = self.meta
        assert meta is not None, "plan() must run before forward()"
        self.pool.write(layer_id, meta.out_cache_loc, k, v)
        if self.decode:
            return self.decoder.attend(layer_id, q)
        out = self._extend(layer_id, q)
        if self.mixed_rows is not None:
            out.index_copy_(0, self.mixed_rows, self.decoder.attend(layer_id, q.index_select(0, self.mixed_rows)))
        return out

    def _gather(self, layer_id: int, slots: torch.Tensor, buf: str = "main") -> tuple[torch.Tensor, torch.Tensor]:
        """K and V of `slots` ([n, kv_heads, head_dim] each), in the reusable buffers `buf`."""
        n, pool = len(slots), self.pool
        bufs = self._gather_bufs.get(buf)
        if bufs is None or bufs[0].shape[0] < n:
            shape = (max(n, 2 * bufs[0].shape[0] if bufs else n), *pool.k[0].shape[1:])
            bufs = self._gather_bufs[buf] = [torch.empty(shape, dtype=pool.dtype, device=pool.device) for _ in range(2)]
        k_buf, v_buf = (b[:n] for b in bufs)
        torch.index_select(pool.k[layer_id], 0, slots, out=k_buf)
        torch.index_select(pool.v[layer_id], 0, slots, out=v_buf)
        return k_buf, v_buf

    def _extend(self, layer_id: int, q: torch.Tensor) -> torch.Tensor:
        """The extend_plan rows of `q`'s attention (rows of other requests are left unset)."""
        kvh, group, d = self.num_kv_heads, self.group, self.head_dim
        if self.extend_kernel is not None:
            # A q of another dtype than the pool's (fp32 activations over a bf16 cache) is rounded to it.
            q3 = q.to(self.pool.dtype).contiguous().view(q.shape[0], self.num_heads, d)
            o3 = torch.empty_like(q3)
            self.extend_kernel.prefill_attention(q3, self.pool.k[layer_id], self.pool.v[layer_id], self.kernel_slots,
                                                 self.q_indptr, self.kv_indptr, self.scale, o3, self.window or 0)
            return o3.view(q.shape[0], -1).to(q.dtype)
        out = torch.empty((q.shape[0], self.num_heads * d), dtype=q.dtype, device=q.device)
        for q_start, ext_len, req_slots, mask, prefix_len in self.extend_plan:
            q_req = q[q_start : q_start + ext_len].view(ext_len, kvh, group, d)
            # [ext, kvh, group, d] -> [1, kvh, group * ext, d]: query rows grouped per KV head.
            # NOTE: 4-D inputs: SDPA takes its (much slower) math path for 3-D ones on CPU.
            q_req = q_req.permute(1, 2, 0, 3).reshape(1, kvh, group * ext_len, d)
            k_req, v_req = self._gather(layer_id, req_slots)
            k_req = k_req.transpose(0, 1).unsqueeze(0).to(q.dtype)
            v_req = v_req.transpose(0, 1).unsqueeze(0).to(q.dtype)
            if mask is not None and mask.dtype != q.dtype:
                mask = mask.to(q.dtype)
            if self.softcap is not None:
                o = eager_attention(q_req[0], k_req[0], v_req[0], mask, self.scale, self.softcap)
            elif q.dtype == torch.bfloat16:
                o = _gemm_attention(q_req[0], k_req[0], v_req[0], mask, prefix_len, self.scale)
            else:
                o = F.scaled_dot_product_attention(q_req, k_req, v_req, attn_mask=mask, scale=self.scale)
            o = o.view(kvh, group, ext_len, d).permute(2, 0, 1, 3).reshape(ext_len, -1)
            out[q_start : q_start + ext_len] = o
        return out


def _gemm_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None,
                    visible: int, scale: float) -> torch.Tensor:
    """bf16 attention as two oneDNN GEMMs and a softmax: q [H, M, D], k and v [H, L, D], an
    additive mask [M, L] whose first `visible` columns are zero.

    NOTE: SDPA's CPU flash kernel runs bf16 at about a sixth of the GEMM's speed: for a 128-token
    chunk over a 1152-token context this is 1.1 ms against 2.0 ms a layer (a 256-token prompt:
    0.43 against 0.99 ms). The scores are rounded to bf16 before the (fp32) softmax, as in
    Hugging Face's eager attention; against HF the default model's log-probs moved closer.
    """
    scores = torch.matmul(q * scale, k.transpose(1, 2))
    if mask is not None:  # the first `visible` columns (the cached prefix) are never masked
        scores[..., visible:].add_(mask[:, visible:])
    return torch.matmul(torch.softmax(scores, dim=-1), v)


def _starts(lengths: list[int]) -> list[int]:
    """Exclusive prefix sums: where each request's rows start."""
    starts, total = [], 0
    for n in lengths:
        starts.append(total)
        total += n
    return starts
