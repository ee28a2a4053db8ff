"""A stand-in for the `flashinfer` package on CPU: FlashInfer 0.6.18.post1's two paged wrappers
with their exact signatures (an unknown keyword is a TypeError, as for the real ones), the checks
the library or its kernels make (tests/kernels/fake_flashinfer_checks.py: dtypes, devices, shapes,
GQA groups, graph-mode buffers), a record of every plan() call, and a plain-torch paged attention
in run(), so a runner driving it computes real outputs.

As in FlashInfer, plan() reads the indptrs and last-page lengths on the host and takes the page
list to the workspace's device (a graph-mode wrapper copies all into its buffers, which its run()
reads). Device indptrs or a host page list are legal but cost a copy per batch: `COPIES` records
them. Arguments the attention here would silently ignore raise NotImplementedError.

plan() loads the kernel module it needs as FlashInfer's does (the FA2 prefill module, or the
CUDA-core decode one), through tests/kernels/fake_flashinfer_jit.py's load path when that stand-in
is installed (the GPU check's dry run); the fused ops load theirs likewise.

Install it with `install(monkeypatch)`; `PLANS` then lists (wrapper kind, the plan's arguments).
"""

from __future__ import annotations

import sys
import types
from typing import Any

import pytest
import torch

from tests.kernels import fake_flashinfer_checks as check
from tests.kernels import fake_flashinfer_ops
from tests.kernels.fake_flashinfer_checks import CUDA_CORE_GROUPS  # noqa: F401 (part of the stand-in's API)
from tests.kernels.fake_flashinfer_jit import load_for_call, models_loading

PLANS: list[tuple[str, dict[str, Any]]] = []
WORKSPACES: list[torch.Tensor] = []
COPIES: list[tuple[str, str, str]] = []  # (wrapper kind, argument, "to host" | "to device") made by plan()
HOST_ARGS = ("qo_indptr", "kv_indptr", "last_page_len")


class _Paged:
    """What both wrappers share: construction checks, plan bookkeeping, run() and the attention."""

    kind = ""

    def __init__(self, workspace: torch.Tensor, kv_layout: str, use_cuda_graph: bool, buffers: dict[str, Any],
                 backend: str, jit: dict[str, Any]) -> None:
        check.check_workspace(workspace, kv_layout)
        check.not_emulated(type(self).__name__, jit, kv_layout=(kv_layout, "NHD"))
        if backend not in ("auto", "fa2", "fa3"):
            raise NotImplementedError(f"the FlashInfer stand-in does not emulate backend {backend!r}")
        WORKSPACES.append(workspace)
        self.device = workspace.device
        self._backend = backend
        self._use_cuda_graph = use_cuda_graph
        self._pin_memory_int_workspace_buffer = torch.empty(8 << 20, dtype=torch.uint8)  # pinned in FlashInfer
        self.buffers: dict[str, torch.Tensor] = buffers if use_cuda_graph else {}
        self.fixed_batch = check.graph_batch(buffers, self.device) if use_cuda_graph else 0
        self.planned: dict[str, Any] | None = None

    @property
    def is_cuda_graph_enabled(self) -> bool:
        return self._use_cuda_graph

    def _plan(self, args: dict[str, Any]) -> None:
        # This stands for FlashInfer's own host work: hidden from the sync recorder of the runner's code.
        with torch._C.DisableTorchFunction():
            self._record_plan(args)

    def _record_plan(self, args: dict[str, Any]) -> None:
        given = {name: t.clone() if isinstance(t, torch.Tensor) else t for name, t in args.items()}
        for name in (*HOST_ARGS, "indices"):
            if name in args:
                check.check_index(name, args[name])
        for name in HOST_ARGS:
            if name in args:
                args[name] = self._to_host(name, args[name])
        cuda_core_decode = self.kind == "decode" and not args["use_tensor_cores"]
        check.check_heads(args["num_qo_heads"], args["num_kv_heads"], cuda_core_decode)
        if self._use_cuda_graph:
            self._check_fixed_batch(args)
        check.check_layout(args["kv_indptr"].tolist(), args["last_page_len"].tolist(), len(args["indices"]),
                           args["page_size"], args["qo_indptr"].tolist() if "qo_indptr" in args else None)
        args["indices"] = self._stage(args)
        self._load_kernels(args)
        PLANS.append((self.kind, given))  # the arguments as handed to plan()
        self.planned = args

    def _load_kernels(self, p: dict[str, Any]) -> None:
        """prefill.py / decode.py plan: the module of the planned dtypes, head size, sliding window
        and soft cap (no positional encoding: not_emulated refuses it). The tensor-core decode runs
        the prefill kernels, its backend "auto" being "fa2" for 16-bit KV."""
        common = (p["q_data_type"], p["kv_data_type"], p["o_data_type"], torch.int32, p["head_dim"], p["head_dim"],
                  0, p["window_left"] >= 0, p["logits_soft_cap"] > 0)
        if not models_loading():
            return
        if self.kind == "decode" and not p["use_tensor_cores"]:
            load_for_call("flashinfer.decode.get_batch_decode_module", *common)
            return
        backend = "fa2" if self.kind == "decode" else self._backend
        if backend == "auto":  # determine_attention_backend: fa3 on Hopper, a module our build lacks
            raise NotImplementedError("the FlashInfer stand-in loads prefill modules for backend='fa2' only")
        load_for_call("flashinfer.prefill.get_batch_prefill_module", backend, *common, False)

    def _to_host(self, name: str, t: torch.Tensor) -> torch.Tensor:
        """decode.py _plan_impl / prefill.py plan read these on the host (`.to("cpu")`): for a
        device tensor that is a blocking copy per batch, legal but recorded. The clone stands for
        the copy plan() queues to the device (or into the graph buffers)."""
        if t.device.type != "cpu":
            COPIES.append((self.kind, name, "to host"))
        return t.to("cpu").clone()

    def _check_fixed_batch(self, args: dict[str, Any]) -> None:
        """decode.py _plan_impl / prefill.py plan in graph mode."""
        batch = len(args["last_page_len"])
        if batch != self.fixed_batch:
            raise ValueError(f"The batch size should be fixed in cudagraph mode, the runtime batch size {batch} "
                             f"mismatches the batch size set during initialization {self.fixed_batch}")
        if len(args["indices"]) > len(self.buffers["indices"]):
            raise ValueError("The size of indices should be less than or equal to the allocated buffer")

    def _stage(self, args: dict[str, Any]) -> torch.Tensor:
        """Where run() will read the page list: the graph buffers (plan() copies the batch into them),
        else the page list on the workspace's device (`indices.to(device)`: itself when it is there)."""
        indices = args["indices"]
        if indices.device != self.device:
            COPIES.append((self.kind, "indices", "to device"))
        if not self._use_cuda_graph:
            return indices.to(self.device)
        for name in HOST_ARGS:
            if name in self.buffers:
                self.buffers[name].copy_(args[name])
        self.buffers["indices"][: len(indices)].copy_(indices)
        return self.buffers["indices"]

    def _attend(self, q: torch.Tensor, paged_kv_cache: Any, args: tuple[Any, ...], out: torch.Tensor | None,
                window_left: int | None) -> torch.Tensor:
        """run()'s checks (decode.py / prefill.py run), then the attention. This stands for the
        GPU's work: hidden from the sync recorder of the runner's own code."""
        with torch._C.DisableTorchFunction():
            p = self.planned
            if p is None:
                raise AttributeError(f"'{type(self).__name__}' object has no attribute '_cached_q_data_type'")
            if args:
                raise TypeError(f"run() takes 2 positional arguments without jit_args, got {2 + len(args)}")
            k, v = check.unpack_kv(paged_kv_cache)
            qo = self._layout("qo_indptr")
            check.check_q(q, p, qo[-1], self.device)  # prefill.py run: q rows = qo_indptr[-1]
            check.check_kv(k, v, p, self.device)
            # run() asserts it equals the planned one
            assert window_left is None or window_left == p["window_left"], (window_left, p["window_left"])
            if out is not None:
                check.check_out(out, q, p["o_data_type"])
            result = _paged_attention(q, k, v, qo, self._layout("kv_indptr"), self._layout("last_page_len"),
                                      p["indices"], p)
            return result if out is None else out.copy_(result)

    def _layout(self, name: str) -> list[int]:
        """What the kernels read at run(): the graph buffers in graph mode, else the planned copy."""
        p = self.planned
        assert p is not None
        if name == "qo_indptr" and name not in p:  # decode: one query per request
            return list(range(len(p["last_page_len"]) + 1))
        source = self.buffers[name] if self._use_cuda_graph and name in self.buffers else p[name]
        return source.tolist()


class BatchPrefillWithPagedKVCacheWrapper(_Paged):
    kind = "prefill"

    def __init__(self, float_workspace_buffer: torch.Tensor, kv_layout: str = "NHD", use_cuda_graph: bool = False,
                 qo_indptr_buf: Any = None, paged_kv_indptr_buf: Any = None, paged_kv_indices_buf: Any = None,
                 paged_kv_last_page_len_buf: Any = None, custom_mask_buf: Any = None, mask_indptr_buf: Any = None,
                 backend: str = "auto", jit_args: Any = None, jit_kwargs: Any = None) -> None:
        super().__init__(float_workspace_buffer, kv_layout, use_cuda_graph, dict(
            qo_indptr=qo_indptr_buf, kv_indptr=paged_kv_indptr_buf, indices=paged_kv_indices_buf,
            last_page_len=paged_kv_last_page_len_buf), backend, dict(jit_args=jit_args, jit_kwargs=jit_kwargs))

    def plan(self, qo_indptr: torch.Tensor, paged_kv_indptr: torch.Tensor, paged_kv_indices: torch.Tensor,
             paged_kv_last_page_len: torch.Tensor, num_qo_heads: int, num_kv_heads: int, head_dim_qk: int,
             page_size: int, head_dim_vo: int | None = None, custom_mask: Any = None, packed_custom_mask: Any = None,
             causal: bool = False, pos_encoding_mode: str = "NONE", use_fp16_qk_reduction: bool = False,
             sm_scale: float | None = None, window_left: int = -1, logits_soft_cap: float | None = None,
             rope_scale: float | None = None, rope_theta: float | None = None, q_data_type: Any = "float16",
             kv_data_type: Any = None, o_data_type: Any = None, non_blocking: bool = True,
             prefix_len_ptr: Any = None, token_pos_in_items_ptr: Any = None, token_pos_in_items_len: int = 0,
             max_item_len_ptr: Any = None, seq_lens: Any = None, seq_lens_q: Any = None, block_tables: Any = None,
             max_token_per_sequence: int | None = None, max_sequence_kv: int | None = None,
             fixed_split_size: int | None = None, disable_split_kv: bool = False) -> None:
        """prefill.py BatchPrefillWithPagedKVCacheWrapper.plan (every parameter positional-or-keyword)."""
        q, kv, o = check.plan_dtypes(q_data_type, kv_data_type, o_data_type)
        check.not_emulated(
            "BatchPrefillWithPagedKVCacheWrapper.plan", dict(
                custom_mask=custom_mask, packed_custom_mask=packed_custom_mask, prefix_len_ptr=prefix_len_ptr,
                token_pos_in_items_ptr=token_pos_in_items_ptr,
                max_item_len_ptr=max_item_len_ptr, seq_lens=seq_lens, seq_lens_q=seq_lens_q, block_tables=block_tables,
                max_token_per_sequence=max_token_per_sequence, max_sequence_kv=max_sequence_kv),
            head_dim_vo=(head_dim_vo or head_dim_qk, head_dim_qk), pos_encoding_mode=(pos_encoding_mode, "NONE"),
            use_fp16_qk_reduction=(use_fp16_qk_reduction, False), token_pos_in_items_len=(token_pos_in_items_len, 0))
        self._plan(dict(qo_indptr=qo_indptr, kv_indptr=paged_kv_indptr, indices=paged_kv_indices,
                        last_page_len=paged_kv_last_page_len, num_qo_heads=num_qo_heads, num_kv_heads=num_kv_heads,
                        head_dim=head_dim_qk, page_size=page_size, causal=causal, q_data_type=q, kv_data_type=kv,
                        o_data_type=o, sm_scale=sm_scale, non_blocking=non_blocking, backend=self._backend,
                        window_left=window_left, logits_soft_cap=logits_soft_cap or 0.0))

    def run(self, q: torch.Tensor, paged_kv_cache: Any, *args: Any, q_scale: Any = None, k_scale: Any = None,
            v_scale: Any = None, out: torch.Tensor | None = None, lse: torch.Tensor | None = None,
            return_lse: bool = False, enable_pdl: bool | None = None, window_left: int | None = None,
            sinks: torch.Tensor | None = None, kv_cache_sf: Any = None,
            skip_softmax_threshold_scale_factor: float | None = None, use_fp16_softmax: bool | None = None,
            uses_spcompress: bool | None = None) -> torch.Tensor:
        """prefill.py BatchPrefillWithPagedKVCacheWrapper.run."""
        check.not_emulated("BatchPrefillWithPagedKVCacheWrapper.run", dict(
            q_scale=q_scale, k_scale=k_scale, v_scale=v_scale, lse=lse, sinks=sinks, kv_cache_sf=kv_cache_sf,
            skip_softmax_threshold_scale_factor=skip_softmax_threshold_scale_factor,
            use_fp16_softmax=use_fp16_softmax, uses_spcompress=uses_spcompress), return_lse=(return_lse, False))
        return self._attend(q, paged_kv_cache, args, out, window_left)


class BatchDecodeWithPagedKVCacheWrapper(_Paged):
    kind = "decode"

    def __init__(self, float_workspace_buffer: torch.Tensor, kv_layout: str = "NHD", use_cuda_graph: bool = False,
                 use_tensor_cores: bool = False, paged_kv_indptr_buffer: Any = None,
                 paged_kv_indices_buffer: Any = None, paged_kv_last_page_len_buffer: Any = None,
                 backend: str = "auto", jit_args: Any = None) -> None:
        super().__init__(float_workspace_buffer, kv_layout, use_cuda_graph, dict(
            kv_indptr=paged_kv_indptr_buffer, indices=paged_kv_indices_buffer,
            last_page_len=paged_kv_last_page_len_buffer), backend, dict(jit_args=jit_args))
        self._use_tensor_cores = use_tensor_cores

    @property
    def use_tensor_cores(self) -> bool:
        return self._use_tensor_cores

    def plan(self, indptr: torch.Tensor, indices: torch.Tensor, last_page_len: torch.Tensor, num_qo_heads: int,
             num_kv_heads: int, head_dim: int, page_size: int, *deprecated_positional_args: Any,
             **kwargs: Any) -> None:
        """decode.py BatchDecodeWithPagedKVCacheWrapper.plan: the rest goes to _plan_impl by keyword,
        so an unknown keyword raises TypeError there, as in FlashInfer."""
        if deprecated_positional_args:
            kwargs = check.merge_legacy_positional(deprecated_positional_args, kwargs)
        self._plan_impl(indptr, indices, last_page_len, num_qo_heads, num_kv_heads, head_dim, page_size, **kwargs)

    def _plan_impl(self, indptr: torch.Tensor, indices: torch.Tensor, last_page_len: torch.Tensor,
                   num_qo_heads: int, num_kv_heads: int, head_dim: int, page_size: int, *,
                   pos_encoding_mode: str = "NONE", window_left: int = -1, window_right: int = 0,
                   logits_soft_cap: float | None = None, q_data_type: Any = "float16", kv_data_type: Any = None,
                   o_data_type: Any = None, data_type: Any = None, sm_scale: float | None = None,
                   rope_scale: float | None = None, rope_theta: float | None = None, non_blocking: bool = True,
                   block_tables: Any = None, seq_lens: Any = None, fixed_split_size: int | None = None,
                   disable_split_kv: bool = False, q_len_per_req: int = 1) -> None:
        """decode.py BatchDecodeWithPagedKVCacheWrapper._plan_impl."""
        if window_right != 0:
            raise NotImplementedError("BatchDecodeWithPagedKVCacheWrapper only supports window_right != 0 "
                                      "with backend='cute-dsl'")
        if q_len_per_req < 1:
            raise ValueError(f"q_len_per_req must be >= 1, got {q_len_per_req}")
        if data_type is not None:
            q_data_type = data_type if q_data_type is None else q_data_type
            kv_data_type = data_type if kv_data_type is None else kv_data_type
        q, kv, o = check.plan_dtypes(q_data_type, kv_data_type, o_data_type)
        if fixed_split_size is not None and not self._use_tensor_cores:
            raise ValueError("fixed_split_size is only supported by tensor core decode for now.")
        check.not_emulated(
            "BatchDecodeWithPagedKVCacheWrapper.plan", dict(
                block_tables=block_tables, seq_lens=seq_lens),
            pos_encoding_mode=(pos_encoding_mode, "NONE"), q_len_per_req=(q_len_per_req, 1))
        self._plan(dict(kv_indptr=indptr, indices=indices, last_page_len=last_page_len, num_qo_heads=num_qo_heads,
                        num_kv_heads=num_kv_heads, head_dim=head_dim, page_size=page_size, causal=False,
                        q_data_type=q, kv_data_type=kv, o_data_type=o, sm_scale=sm_scale, non_blocking=non_blocking,
                        use_tensor_cores=self._use_tensor_cores, window_left=window_left,
                        logits_soft_cap=logits_soft_cap or 0.0))

    def run(self, q: torch.Tensor, paged_kv_cache: Any, *args: Any, q_scale: float | None = None,
            k_scale: float | None = None, v_scale: float | None = None, out: torch.Tensor | None = None,
            lse: torch.Tensor | None = None, return_lse: bool = False, enable_pdl: bool | None = None,
            window_left: int | None = None, sinks: torch.Tensor | None = None, q_len_per_req: int | None = None,
            skip_softmax_threshold_scale_factor: float | None = None, kv_cache_sf: Any = None) -> torch.Tensor:
        """decode.py BatchDecodeWithPagedKVCacheWrapper.run."""
        check.not_emulated("BatchDecodeWithPagedKVCacheWrapper.run", dict(
            q_scale=q_scale, k_scale=k_scale, v_scale=v_scale, lse=lse, sinks=sinks, q_len_per_req=q_len_per_req,
            kv_cache_sf=kv_cache_sf, skip_softmax_threshold_scale_factor=skip_softmax_threshold_scale_factor),
            return_lse=(return_lse, False))
        return self._attend(q, paged_kv_cache, args, out, window_left)


def _paged_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, qo: list[int], kv: list[int],
                     last: list[int], indices: torch.Tensor, p: dict[str, Any]) -> torch.Tensor:
    """Per request: gather its pages' tokens, attend (GQA by repeating KV heads: a test oracle).
    Causal masks align the queries with the end of the request's KV, as FlashInfer's do; a query at
    position i sees keys i - window_left .. i (window_left >= 0), scores soft-capped when asked."""
    ps, group = k_cache.shape[1], p["num_qo_heads"] // p["num_kv_heads"]
    out = torch.empty(q.shape, dtype=p["o_data_type"], device=q.device)
    for i in range(len(last)):
        pages = indices[kv[i] : kv[i + 1]].long()
        n = (len(pages) - 1) * ps + last[i]
        k = k_cache[pages].reshape(-1, *k_cache.shape[2:])[:n].repeat_interleave(group, dim=1)
        v = v_cache[pages].reshape(-1, *v_cache.shape[2:])[:n].repeat_interleave(group, dim=1)
        rows = q[qo[i] : qo[i + 1]]
        e = rows.shape[0]
        positions = torch.arange(n, device=q.device)
        q_pos = (n - e + torch.arange(e, device=q.device))[:, None]  # decode: the one query is the last token
        mask = positions[None, :] <= q_pos if p["causal"] else torch.ones(e, n, dtype=torch.bool, device=q.device)
        if p["window_left"] >= 0:
            mask &= positions[None, :] >= q_pos - p["window_left"]
        o = _attend_rows(rows.transpose(0, 1).float(), k.transpose(0, 1).float(), v.transpose(0, 1).float(), mask,
                         p["sm_scale"], p["logits_soft_cap"])
        out[qo[i] : qo[i + 1]] = o.transpose(0, 1).to(out.dtype)
    return out


def _attend_rows(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, scale: float | None,
                 softcap: float) -> torch.Tensor:
    """[H, e, D] queries over [H, n, D] keys: a plain masked softmax (soft-capped when softcap > 0)."""
    scores = q @ k.transpose(-1, -2) * (scale if scale is not None else q.shape[-1] ** -0.5)
    if softcap > 0:
        scores = torch.tanh(scores / softcap) * softcap
    return torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1) @ v


def _module() -> types.ModuleType:
    module = types.ModuleType("flashinfer")
    module.BatchPrefillWithPagedKVCacheWrapper = BatchPrefillWithPagedKVCacheWrapper  # type: ignore[attr-defined]
    module.BatchDecodeWithPagedKVCacheWrapper = BatchDecodeWithPagedKVCacheWrapper  # type: ignore[attr-defined]
    for function in fake_flashinfer_ops.FUNCTIONS:  # the fused per-token kernels
        setattr(module, function.__name__, function)
    return module


def install(monkeypatch: pytest.MonkeyPatch) -> types.ModuleType:
    module = _module()
    monkeypatch.setitem(sys.modules, "flashinfer", module)
    for record in (PLANS, WORKSPACES, COPIES):
        record.clear()
    return module


def install_module() -> types.ModuleType:
    """The same as `install`, for a script (scripts/gpu_check.py --dry-run): for the process."""
    module = _module()
    sys.modules["flashinfer"] = module
    return module
