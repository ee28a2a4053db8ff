"""Paged attention with FlashInfer's batch wrappers (CUDA only; imported lazily).

NOTE: written against FlashInfer's documented Python API (BatchPrefillWithPagedKVCacheWrapper /
BatchDecodeWithPagedKVCacheWrapper: plan() once per batch, run() per layer, NHD layout) and not
yet run on a GPU: our machines have none. `tests/kernels/test_flashinfer_backend.py` compares it
with the torch backend and skips without CUDA.
"""

from __future__ import annotations

import torch

from kernels.base import AttentionBackend, ForwardMetadata
from runtime.kv_pool import KVPool

WORKSPACE_BYTES = 128 * 1024 * 1024


class FlashInferAttentionBackend(AttentionBackend):
    """One prefill and one decode wrapper sharing a workspace; the pool is read as NHD pages."""

    def __init__(self, pool: KVPool, num_heads: int, num_kv_heads: int, head_dim: int) -> None:
        import flashinfer

        self.pool = pool
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        workspace = torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device=pool.device)
        self.prefill = flashinfer.BatchPrefillWithPagedKVCacheWrapper(workspace, "NHD")
        self.decode = flashinfer.BatchDecodeWithPagedKVCacheWrapper(workspace, "NHD")
        self.meta: ForwardMetadata | None = None
        self.is_decode = False

    def plan(self, meta: ForwardMetadata) -> None:
        self.meta = meta
        self.is_decode = meta.is_decode
        common = dict(
            num_qo_heads=self.num_heads,
            num_kv_heads=self.num_kv_heads,
            page_size=meta.page_size,
            q_data_type=self.pool.dtype,
            kv_data_type=self.pool.dtype,
        )
        if self.is_decode:
            self.decode.plan(
                meta.kv_indptr, meta.kv_indices, meta.kv_last_page_len, head_dim=self.head_dim, **common
            )
        else:
            self.prefill.plan(
                meta.qo_indptr,
                meta.kv_indptr,
                meta.kv_indices,
                meta.kv_last_page_len,
                head_dim_qk=self.head_dim,
                causal=True,
                **common,
            )

    def forward(self, layer_id: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        meta = self.meta
        assert meta is not None, "plan() must run before forward()"
        self.pool.write(layer_id, meta.out_cache_loc, k, v)
        paged_kv = self.pool.paged(layer_id)
        wrapper = self.decode if self.is_decode else self.prefill
        out = wrapper.run(q.contiguous().to(self.pool.dtype), paged_kv)
        return out.reshape(q.shape[0], self.num_heads * self.head_dim).to(q.dtype)
