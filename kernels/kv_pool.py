"""Device memory for attention: the per-layer K/V pool and the request-slot table.

    KVPool.k[layer], KVPool.v[layer]: [num_slots, kv_heads, head_dim]; slot 0 is padding.
    ReqToTokenPool.table: int32 [max_requests + 1, max_context_len]; table[row, pos] = KV slot of
    token `pos` of the request that owns `row`. Rows are handed out by `alloc()` / `free()`; the
    model runner writes them (all of a step's writes in one scatter).

The slot *allocator* (which slots are free) is pure Python in `radix/allocator.py`; this module
only owns tensors.
"""

from __future__ import annotations

import torch


class KVPool:
    """Per-layer K and V tensors indexed by KV slot."""

    def __init__(
        self,
        num_layers: int,
        num_slots: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device,
        page_size: int = 1,
    ) -> None:
        # NOTE: `num_slots` counts slot 0; usable slots are 1..num_slots-1. It is a multiple of
        # page_size so the pool also reads as [num_pages, page_size, kv_heads, head_dim].
        assert num_slots % page_size == 0, (num_slots, page_size)
        self.num_slots = num_slots
        self.page_size = page_size
        self.dtype = dtype
        self.device = device
        shape = (num_slots, num_kv_heads, head_dim)
        self.k = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.v = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]

    def write(self, layer_id: int, loc: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Store the new tokens' K/V at slots `loc` (int64 [T])."""
        self.k[layer_id].index_copy_(0, loc, k.to(self.dtype))
        self.v[layer_id].index_copy_(0, loc, v.to(self.dtype))

    def paged(self, layer_id: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The layer's K and V viewed as [num_pages, page_size, kv_heads, head_dim] (NHD)."""
        k, v = self.k[layer_id], self.v[layer_id]
        shape = (self.num_slots // self.page_size, self.page_size, *k.shape[1:])
        return k.view(shape), v.view(shape)

    @staticmethod
    def bytes_per_token(num_layers: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype) -> int:
        return 2 * num_layers * num_kv_heads * head_dim * torch.tensor([], dtype=dtype).element_size()


class ReqToTokenPool:
    """The request-slot table: one row of KV slot ids per running request."""

    def __init__(self, max_requests: int, max_context_len: int, device: torch.device) -> None:
        self.size = max_requests
        self.max_context_len = max_context_len
        # One row more than requests: the padding row of CUDA-graph batches (never handed out;
        # its first entry stays slot 0).
        self.padding_row = max_requests
        self.table = torch.zeros((max_requests + 1, max_context_len), dtype=torch.int32, device=device)
        self.free_rows: list[int] = list(range(max_requests))

    def alloc(self) -> int | None:
        """A free row, or None when every row is taken."""
        return self.free_rows.pop() if self.free_rows else None

    def free(self, row: int) -> None:
        assert 0 <= row < self.size and row not in self.free_rows, f"bad free of row {row}"
        self.free_rows.append(row)

    def available(self) -> int:
        return len(self.free_rows)

    def check_integrity(self) -> None:
        if len(set(self.free_rows)) != len(self.free_rows):
            raise AssertionError(f"request rows freed twice: {sorted(self.free_rows)}")
        if any(not 0 <= r < self.size for r in self.free_rows):
            raise AssertionError(f"request row out of range in free list: {self.free_rows}")

    def clear(self) -> None:
        self.free_rows = list(range(self.size))
