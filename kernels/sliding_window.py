"""Sliding-window attention: which keys a window leaves, and layers of different windows.

A query at position q sees the keys at positions p with q - window < p <= q, as Hugging Face's
masks do for Mistral, Phi-3 and Gemma (`kv_idx > q_idx - sliding_window`). A decode row (its
query is the last token) therefore sees exactly the last `window` keys of its sequence: the
decode paths (our C++ kernels included) only get those slots, and prefill paths mask per row.

KV outside every window stays in the pool and the prefix cache (it is never read): cached
prefixes keep working, and a request that shares one later reads only what its window covers.

A model whose layers differ (Gemma: sliding and global layers) gets one backend per distinct
window behind `PerLayerBackend`; each plans the same batch, and layer i attends through its own.
"""

from __future__ import annotations

import torch

from kernels.base import AttentionBackend, DecodeKernelInputs, ForwardMetadata


def last_keys(slots: torch.Tensor, seq_lens: list[int], window: int | None) -> tuple[torch.Tensor, list[int]]:
    """Each row's last `window` KV slots (`slots`: every row's, row after row) and their counts."""
    if window is None or max(seq_lens, default=0) <= window:
        return slots, seq_lens
    pieces, lens, start = [], [], 0
    for n in seq_lens:
        keep = min(n, window)
        pieces.append(slots[start + n - keep : start + n])
        lens.append(keep)
        start += n
    return torch.cat(pieces), lens


def visible(q_pos: torch.Tensor, k_pos: torch.Tensor, window: int | None) -> torch.Tensor:
    """bool [len(q_pos), len(k_pos)]: which keys each query sees (causal, within the window)."""
    allowed = k_pos[None, :] <= q_pos[:, None]
    if window is not None:
        allowed &= k_pos[None, :] > q_pos[:, None] - window
    return allowed


class PerLayerBackend(AttentionBackend):
    """Layers of different windows, each through the backend of its window (all share one pool)."""

    def __init__(self, backends: dict[int | None, AttentionBackend], layer_windows: tuple[int | None, ...]) -> None:
        self.backends = backends
        self.by_layer = [backends[w] for w in layer_windows]
        self.smallest = min(w for w in backends if w is not None)
        self.longest_seq = 0

    def plan(self, meta: ForwardMetadata) -> None:
        self.longest_seq = max(meta.seq_lens, default=0)
        for backend in self.backends.values():
            backend.plan(meta)

    def forward(self, layer_id: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return self.by_layer[layer_id].forward(layer_id, q, k, v)

    def decode_kernel_inputs(self) -> DecodeKernelInputs | None:
        """One set of KV slots for every layer (decode_stack): only while no window drops a key."""
        if self.longest_seq > self.smallest:
            return None
        return self.by_layer[0].decode_kernel_inputs()

    def init_cuda_graph(self, sizes: list[int], max_pages: int) -> None:
        for backend in self.backends.values():
            backend.init_cuda_graph(sizes, max_pages)

    def plan_cuda_graph(self, size: int, meta: ForwardMetadata) -> None:
        self.longest_seq = max(meta.seq_lens, default=0)
        for backend in self.backends.values():
            backend.plan_cuda_graph(size, meta)
