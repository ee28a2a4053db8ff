"""Paged attention with FlashInfer's batch wrappers (CUDA only; imported lazily).

Written against FlashInfer 0.6.x's Python API (`BatchPrefillWithPagedKVCacheWrapper`,
`BatchDecodeWithPagedKVCacheWrapper`: plan() once per batch on the host, run() per layer, NHD
pages) the way SGLang drives it, and NOT yet run on a GPU (see the README). On CPU its calls are
checked against a stand-in module with FlashInfer's signatures (`tests/kernels/fake_flashinfer.py`).

How it is used, and why:
- Decode runs FlashInfer's tensor-core kernels where the GQA group needs them or gains from them
  (`kernels/flashinfer_support.py`); prefill is pinned to the FA2 kernels, as in SGLang.
- plan() receives the indptrs and last-page lengths as host tensors (pinned): given device
  tensors it copies them back to the host, a blocking copy per batch. The page list stays on
  the device. q is passed in the model dtype, planned as `q_data_type`.
- plan() stages its scheduling data in a pinned host buffer and queues an unfenced copy of it:
  the wrappers share two such buffers, used alternately and guarded by events
  (kernels/flashinfer_staging.py), so no plan() overwrites data a queued copy has yet to read.
- `AttentionOptions` go to plan(): `sm_scale`, `logits_soft_cap` and `window_left` (FlashInfer's
  window counts the keys left of the query: HF's window of w keys, the query's own included, is
  window_left = w - 1). They are passed only when set, so a plain model plans as before.
- CUDA graphs: one decode wrapper per captured batch size in graph mode, over slices of shared
  index buffers sized for the largest bucket; planned before each replay, its run() captured.
"""

from __future__ import annotations

from typing import Any

import torch

from kernels.base import AttentionBackend, AttentionOptions, ForwardMetadata
from kernels.flashinfer_staging import PlanStaging
from kernels.flashinfer_support import PREFILL_BACKEND, WORKSPACE_BYTES, decode_uses_tensor_cores, import_flashinfer
from kernels.kv_pool import KVPool


class FlashInferAttentionBackend(AttentionBackend):
    """One prefill and one decode wrapper sharing a workspace (plus the graph decode wrappers)."""

    def __init__(
        self, pool: KVPool, num_heads: int, num_kv_heads: int, head_dim: int, q_dtype: torch.dtype,
        workspace_bytes: int = WORKSPACE_BYTES, options: AttentionOptions | None = None,
    ) -> None:
        flashinfer = import_flashinfer()
        self.flashinfer = flashinfer
        self.pool = pool
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.q_dtype = q_dtype
        self.options = _plan_options(options or AttentionOptions())
        kv_dtype = str(pool.dtype).removeprefix("torch.")  # float16 / bfloat16
        self.use_tensor_cores = decode_uses_tensor_cores(num_heads, num_kv_heads, kv_dtype)
        # FlashInfer asks for a zeroed workspace on first use (its split-KV kernels read regions
        # a forward may not have written).
        self.workspace = torch.zeros(workspace_bytes, dtype=torch.uint8, device=pool.device)
        self.staging = PlanStaging.for_device(pool.device)
        self.prefill = flashinfer.BatchPrefillWithPagedKVCacheWrapper(self.workspace, "NHD", backend=PREFILL_BACKEND)
        self.staging.adopt(self.prefill)
        self.decode = self._decode_wrapper()
        self.graph_decode: dict[int, Any] = {}
        self.graph_indices: torch.Tensor | None = None
        self.meta: ForwardMetadata | None = None
        self.wrapper: Any = None

    def _decode_wrapper(self, **graph_buffers: Any) -> Any:
        wrapper = self.flashinfer.BatchDecodeWithPagedKVCacheWrapper(
            self.workspace, "NHD", use_tensor_cores=self.use_tensor_cores, **graph_buffers
        )
        self.staging.adopt(wrapper)
        return wrapper

    def _common(self, meta: ForwardMetadata) -> dict[str, Any]:
        return dict(
            num_qo_heads=self.num_heads,
            num_kv_heads=self.num_kv_heads,
            page_size=meta.page_size,
            q_data_type=self.q_dtype,
            kv_data_type=self.pool.dtype,
            non_blocking=True,
            **self.options,
        )

    def plan(self, meta: ForwardMetadata) -> None:
        self.meta = meta
        if meta.is_decode:
            self.wrapper = self.decode
            self._plan_decode(self.decode, meta)
            return
        self.wrapper = self.prefill
        with self.staging.plan(self.prefill):
            self.prefill.plan(
                meta.qo_indptr_host,
                meta.kv_indptr_host,
                meta.kv_indices,
                meta.kv_last_page_len_host,
                head_dim_qk=self.head_dim,
                causal=True,
                **self._common(meta),
            )

    def _plan_decode(self, wrapper: Any, meta: ForwardMetadata) -> None:
        with self.staging.plan(wrapper):
            wrapper.plan(
                meta.kv_indptr_host, meta.kv_indices, meta.kv_last_page_len_host, head_dim=self.head_dim,
                **self._common(meta),
            )

    def init_cuda_graph(self, sizes: list[int], max_pages: int) -> None:
        """One graph-mode decode wrapper per batch size, over slices of shared buffers."""
        device = self.pool.device
        largest = max(sizes)
        indptr = torch.zeros(largest + 1, dtype=torch.int32, device=device)
        indices = torch.zeros(max_pages, dtype=torch.int32, device=device)
        last_page_len = torch.ones(largest, dtype=torch.int32, device=device)
        self.graph_indices = indices
        for size in sizes:
            self.graph_decode[size] = self._decode_wrapper(
                use_cuda_graph=True,
                paged_kv_indptr_buffer=indptr[: size + 1],
                paged_kv_indices_buffer=indices,
                paged_kv_last_page_len_buffer=last_page_len[:size],
            )

    def graph_page_list(self) -> torch.Tensor | None:
        """The graph wrappers' shared page-list buffer: a replay's page list gathered straight into
        it makes plan()'s copy into the buffer a copy onto itself, which torch skips."""
        return self.graph_indices

    def plan_cuda_graph(self, size: int, meta: ForwardMetadata) -> None:
        """Plan the graph wrapper of `size` (it copies the lengths, and the page list unless it is
        already there, into its buffers)."""
        self.meta = meta
        self.wrapper = self.graph_decode[size]
        self._plan_decode(self.wrapper, meta)

    def forward(self, layer_id: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        meta = self.meta
        assert meta is not None, "plan() must run before forward()"
        self.pool.write(layer_id, meta.out_cache_loc, k, v)
        out = self.wrapper.run(q.contiguous(), self.pool.paged(layer_id))
        return out.reshape(q.shape[0], self.num_heads * self.head_dim)


def _plan_options(options: AttentionOptions) -> dict[str, Any]:
    """plan()'s keywords for the options that are set."""
    planned: dict[str, Any] = {}
    if options.scale is not None:
        planned["sm_scale"] = options.scale
    if options.softcap is not None:
        planned["logits_soft_cap"] = options.softcap
    if options.window is not None:
        planned["window_left"] = options.window - 1
    return planned
