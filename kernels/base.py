"""The attention backend interface and the per-batch metadata both backends consume.

Layout of one batch of B requests (prefill, decode or mixed), flattened over T new tokens:

    request i computes tokens [prefix_len_i, seq_len_i) of its sequence; its new tokens are
    q rows [qo_indptr[i], qo_indptr[i+1]) and its whole KV (cached prefix + new tokens) is the
    pages kv_indices[kv_indptr[i]:kv_indptr[i+1]], the last of which holds kv_last_page_len[i]
    tokens. With page_size 1 a page is a KV slot.

This is exactly what FlashInfer's BatchPrefill/BatchDecodeWithPagedKVCacheWrapper.plan() take,
so the CPU tests exercise the same metadata the CUDA backend gets. The pool stores K and V per
layer as [num_slots, kv_heads, head_dim]; page p holds slots [p * page_size, (p+1) * page_size).
Slot 0 (and so page 0) is reserved as padding and never holds real KV.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import torch


@dataclass
class ForwardMetadata:
    """Tensors describing one batch; built once per batch from `req_to_token`."""

    kv_indices: torch.Tensor  # int32 [num_pages], page ids of every request's KV, in order (device)
    positions: torch.Tensor  # int64 [T], position of each new token in its sequence
    out_cache_loc: torch.Tensor  # int64 [T], KV slot each new token's K/V is written to
    page_size: int
    # Host copies of the lengths, so a backend never needs a device->host sync to plan.
    seq_lens: list[int]  # [B] tokens of KV per request after this step
    extend_lens: list[int]  # [B] new tokens per request in this step
    # The indptrs and last-page lengths as host tensors (pinned on CUDA), and only there: every
    # backend reads them on the host (FlashInfer's plan() would copy device ones back with a
    # blocking copy every batch, and copies these to the device itself).
    qo_indptr_host: torch.Tensor  # int32 [B+1], cumulative new-token counts
    kv_indptr_host: torch.Tensor  # int32 [B+1], cumulative page counts
    kv_last_page_len_host: torch.Tensor  # int32 [B], tokens in each request's last page (1..page_size)
    # [B] whether request b's new tokens were generated (a decode step, a speculative verify)
    # rather than taken from its prompt; None: the requests with one new token.
    generated: list[bool] | None = None

    @property
    def batch_size(self) -> int:
        return len(self.seq_lens)

    def is_generated(self, i: int) -> bool:
        return self.extend_lens[i] == 1 if self.generated is None else self.generated[i]

    @property
    def is_decode(self) -> bool:
        """True when every request computes exactly one new, generated token."""
        return all(n == 1 and self.is_generated(i) for i, n in enumerate(self.extend_lens))

    @property
    def prefix_lens(self) -> list[int]:
        return [s - e for s, e in zip(self.seq_lens, self.extend_lens)]


@dataclass(frozen=True)
class AttentionOptions:
    """What a model's attention asks beyond causal softmax(q k^T / sqrt(head_dim)) v, for the
    layers one backend serves (kernels/sliding_window.py puts layers of different windows on
    backends of their own)."""

    scale: float | None = None  # the softmax scale; None: head_dim ** -0.5
    softcap: float | None = None  # scores -> softcap * tanh(scores / softcap) before the softmax
    # A query at position q sees the keys at q - window < p <= q (Hugging Face's sliding-window
    # masks); None: every key up to q.
    window: int | None = None

    def softmax_scale(self, head_dim: int) -> float:
        return self.scale if self.scale is not None else head_dim**-0.5


@dataclass
class DecodeKernelInputs:
    """A decode batch as kernels/csrc/decode_layer.cpp takes it."""

    out_loc: torch.Tensor  # int64 [B], the slot each row's new K/V is written to
    slots: torch.Tensor  # int64, every row's own KV slots (after shared_slots), row after row
    indptr: torch.Tensor  # int64 [B+1], row b's slots are slots[indptr[b]:indptr[b+1]]
    shared_slots: torch.Tensor | None  # int64, the KV slots every row has first (cascade); None: none
    k_pools: list[torch.Tensor]  # per layer [num_slots, kv_heads, head_dim]
    v_pools: list[torch.Tensor]


class AttentionBackend(ABC):
    """Paged attention over the KV pool. One object per runner, re-planned for every batch."""

    @abstractmethod
    def plan(self, meta: ForwardMetadata) -> None:
        """Prepare for a batch (index expansion, wrapper planning). Called once per batch."""

    @abstractmethod
    def forward(self, layer_id: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """Write this layer's new K/V into the pool, then attend.

        Args:
            q: [T, num_heads, head_dim] queries of the new tokens (rotary already applied).
            k, v: [T, num_kv_heads, head_dim] keys and values of the new tokens.
        Returns:
            [T, num_heads * head_dim], causal attention of each new token over its request's
            cached prefix and the new tokens up to and including itself.
        """

    def decode_kernel_inputs(self) -> DecodeKernelInputs | None:
        """For a planned decode batch whose attention our C++ decode kernels run, what a whole
        decoder layer in C++ needs (runtime/models/decode_stack.py); None otherwise (the default)."""
        return None

    def init_cuda_graph(self, sizes: list[int], max_pages: int) -> None:  # noqa: B027 (optional hook)
        """Prepare per-batch-size state for decode graphs of these sizes (default: none needed)."""

    def graph_page_list(self) -> torch.Tensor | None:
        """The device buffer a graph replay's page list should be gathered into (int32, sized for
        the largest bucket), when the backend's graph-mode planning reads one; None: any tensor."""
        return None

    def plan_cuda_graph(self, size: int, meta: ForwardMetadata) -> None:
        """Plan a graph replay of a `size`-row decode batch. A backend without graph support
        plans eagerly (the CPU stand-in graphs rerun the forward, so that is all they need)."""
        self.plan(meta)
