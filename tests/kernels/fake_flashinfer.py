"""A stand-in for the `flashinfer` package on CPU: FlashInfer 0.6.x's two paged wrappers with
their signatures, the checks they make (graph-mode buffers and fixed batch size, q dtype against
the plan, tensor cores for the group sizes the CUDA-core decode lacks), a record of every plan()
call, and a plain-torch paged attention in run(), so a runner driving it computes real outputs.

Install it with `install(monkeypatch)`; `PLANS` then lists (wrapper kind, the plan's arguments).
"""

from __future__ import annotations

import sys
import types
from typing import Any

import pytest
import torch
import torch.nn.functional as F

CUDA_CORE_GROUPS = {1, 2, 3, 4, 8}  # DISPATCH_GQA_GROUP_SIZE
PLANS: list[tuple[str, dict[str, Any]]] = []
WORKSPACES: list[torch.Tensor] = []


class _Paged:
    """What both wrappers share: plan bookkeeping and the attention itself."""

    kind = ""

    def __init__(self, workspace: torch.Tensor, kv_layout: str, use_cuda_graph: bool, buffers: dict[str, Any]) -> None:
        assert kv_layout == "NHD"
        WORKSPACES.append(workspace)
        self.graph = use_cuda_graph
        if use_cuda_graph:
            for name, buf in buffers.items():
                if not isinstance(buf, torch.Tensor):
                    raise ValueError(f"{name} should be a torch.Tensor in cudagraph mode")
            self.fixed_batch = len(buffers["last_page_len"])
        self.buffers = buffers
        self._pin_memory_int_workspace_buffer = torch.empty(8 << 20, dtype=torch.uint8)
        self.planned: dict[str, Any] | None = None

    def _plan(self, args: dict[str, Any]) -> None:
        with torch._C.DisableTorchFunction():
            self._record_plan(args)

    def _record_plan(self, args: dict[str, Any]) -> None:
        for name in ("qo_indptr", "kv_indptr", "last_page_len"):
            t = args.get(name)
            if t is not None:
                args[name] = t.clone()  # what plan() copies to the host / its buffers now
        if self.graph:
            batch = len(args["last_page_len"])
            if batch != self.fixed_batch:
                raise ValueError(f"The batch size should be fixed in cudagraph mode, the runtime batch size {batch} "
                                 f"mismatches the batch size set during initialization {self.fixed_batch}")
            if len(args["indices"]) > len(self.buffers["indices"]):
                raise ValueError("The size of indices should be less than or equal to the allocated buffer")
        args["indices"] = args["indices"].clone()
        PLANS.append((self.kind, args))
        self.planned = args

    def run(self, q: torch.Tensor, paged_kv_cache: tuple[torch.Tensor, torch.Tensor], **kw: Any) -> torch.Tensor:
        # This stands for the GPU's work: hidden from the sync recorder of the runner's own code.
        with torch._C.DisableTorchFunction():
            return self._run(q, paged_kv_cache)

    def _run(self, q: torch.Tensor, paged_kv_cache: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        p = self.planned
        assert p is not None, "plan() first"
        if q.dtype != p["q_data_type"]:
            raise ValueError(f"The dtype of q {q.dtype} does not match the q_data_type {p['q_data_type']} "
                             "specified in plan function.")
        k_cache, v_cache = paged_kv_cache
        if k_cache.dtype != p["kv_data_type"]:
            raise ValueError("The dtype of k does not match the kv_data_type specified in plan function.")
        return _paged_attention(q, k_cache, v_cache, p, causal=p.get("causal", False))


class BatchPrefillWithPagedKVCacheWrapper(_Paged):
    kind = "prefill"

    def __init__(self, float_workspace_buffer: torch.Tensor, kv_layout: str = "NHD", use_cuda_graph: bool = False,
                 qo_indptr_buf: Any = None, paged_kv_indptr_buf: Any = None, paged_kv_indices_buf: Any = None,
                 paged_kv_last_page_len_buf: Any = None, custom_mask_buf: Any = None, mask_indptr_buf: Any = None,
                 backend: str = "auto", jit_args: Any = None) -> None:
        super().__init__(float_workspace_buffer, kv_layout, use_cuda_graph, dict(
            qo_indptr=qo_indptr_buf, kv_indptr=paged_kv_indptr_buf, indices=paged_kv_indices_buf,
            last_page_len=paged_kv_last_page_len_buf) if use_cuda_graph else {})
        self.backend = backend

    def plan(self, qo_indptr: torch.Tensor, paged_kv_indptr: torch.Tensor, paged_kv_indices: torch.Tensor,
             paged_kv_last_page_len: torch.Tensor, num_qo_heads: int, num_kv_heads: int, head_dim_qk: int,
             page_size: int, head_dim_vo: int | None = None, causal: bool = False, q_data_type: Any = "float16",
             kv_data_type: Any = None, non_blocking: bool = True, **kw: Any) -> None:
        self._plan(dict(qo_indptr=qo_indptr, kv_indptr=paged_kv_indptr, indices=paged_kv_indices,
                        last_page_len=paged_kv_last_page_len, num_qo_heads=num_qo_heads, num_kv_heads=num_kv_heads,
                        head_dim=head_dim_qk, page_size=page_size, causal=causal, q_data_type=q_data_type,
                        kv_data_type=kv_data_type or q_data_type, non_blocking=non_blocking, backend=self.backend))


class BatchDecodeWithPagedKVCacheWrapper(_Paged):
    kind = "decode"

    def __init__(self, float_workspace_buffer: torch.Tensor, kv_layout: str = "NHD", use_cuda_graph: bool = False,
                 use_tensor_cores: bool = False, paged_kv_indptr_buffer: Any = None,
                 paged_kv_indices_buffer: Any = None, paged_kv_last_page_len_buffer: Any = None,
                 backend: str = "auto", jit_args: Any = None) -> None:
        super().__init__(float_workspace_buffer, kv_layout, use_cuda_graph, dict(
            kv_indptr=paged_kv_indptr_buffer, indices=paged_kv_indices_buffer,
            last_page_len=paged_kv_last_page_len_buffer) if use_cuda_graph else {})
        self.use_tensor_cores = use_tensor_cores

    def plan(self, indptr: torch.Tensor, indices: torch.Tensor, last_page_len: torch.Tensor, num_qo_heads: int,
             num_kv_heads: int, head_dim: int, page_size: int, q_data_type: Any = "float16", kv_data_type: Any = None,
             non_blocking: bool = True, **kw: Any) -> None:
        if not self.use_tensor_cores and num_qo_heads // num_kv_heads not in CUDA_CORE_GROUPS:
            raise RuntimeError(f"Unsupported group_size: {num_qo_heads // num_kv_heads}")
        batch = len(last_page_len)
        self._plan(dict(qo_indptr=torch.arange(batch + 1, dtype=torch.int32), kv_indptr=indptr, indices=indices,
                        last_page_len=last_page_len, num_qo_heads=num_qo_heads, num_kv_heads=num_kv_heads,
                        head_dim=head_dim, page_size=page_size, causal=False, q_data_type=q_data_type,
                        kv_data_type=kv_data_type or q_data_type, non_blocking=non_blocking,
                        use_tensor_cores=self.use_tensor_cores))


def _paged_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, p: dict[str, Any],
                     causal: bool) -> torch.Tensor:
    """Per request: gather its pages' tokens, attend (GQA by repeating KV heads: a test oracle)."""
    qo, kv, last = p["qo_indptr"].tolist(), p["kv_indptr"].tolist(), p["last_page_len"].tolist()
    indices = p["indices"].tolist()
    ps, group = k_cache.shape[1], p["num_qo_heads"] // p["num_kv_heads"]
    out = torch.empty_like(q)
    for i in range(len(last)):
        pages = indices[kv[i] : kv[i + 1]]
        n = (len(pages) - 1) * ps + last[i]
        k = k_cache[pages].reshape(-1, *k_cache.shape[2:])[:n].repeat_interleave(group, dim=1)
        v = v_cache[pages].reshape(-1, *v_cache.shape[2:])[:n].repeat_interleave(group, dim=1)
        rows = q[qo[i] : qo[i + 1]]
        e = rows.shape[0]
        mask = torch.arange(n)[None, :] <= (n - e + torch.arange(e))[:, None] if causal else None
        o = F.scaled_dot_product_attention(rows.transpose(0, 1).float(), k.transpose(0, 1).float(),
                                           v.transpose(0, 1).float(), attn_mask=mask)
        out[qo[i] : qo[i + 1]] = o.transpose(0, 1).to(q.dtype)
    return out


def _module() -> types.ModuleType:
    module = types.ModuleType("flashinfer")
    module.BatchPrefillWithPagedKVCacheWrapper = BatchPrefillWithPagedKVCacheWrapper  # type: ignore[attr-defined]
    module.BatchDecodeWithPagedKVCacheWrapper = BatchDecodeWithPagedKVCacheWrapper  # type: ignore[attr-defined]
    return module


def install(monkeypatch: pytest.MonkeyPatch) -> types.ModuleType:
    module = _module()
    monkeypatch.setitem(sys.modules, "flashinfer", module)
    PLANS.clear()
    WORKSPACES.clear()
    return module


def install_module() -> types.ModuleType:
    """The same as `install`, for a script (scripts/gpu_check.py --dry-run): for the process."""
    module = _module()
    sys.modules["flashinfer"] = module
    return module
