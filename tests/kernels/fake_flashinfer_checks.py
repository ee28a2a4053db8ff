"""The argument checks of FlashInfer 0.6.18.post1's paged wrappers, for its CPU stand-in
(tests/kernels/fake_flashinfer.py). Each says what in the real library it mirrors (paths under
flashinfer/ in the wheel) and raises the exception type the real one raises there.

Where the real library fails in C++ (tvm-ffi checks, FLASHINFER_ERROR) the stand-in raises
RuntimeError; where it would read out of bounds or compute garbage without a check, the stand-in
refuses with ValueError: a CPU test should fail where a GPU run would go wrong.
"""

from __future__ import annotations

import warnings
from typing import Any

import torch

# csrc/batch_decode.cu: DISPATCH_GQA_GROUP_SIZE (include/flashinfer/utils.cuh) in 0.6.18.post1.
CUDA_CORE_GROUPS = frozenset({1, 2, 3, 4, 6, 8})
# jit/utils.py filename_safe_dtype_map (q, o) and dtype_map_kv (KV, less nvfp4): kernel names are
# built from these maps in plan(), which raises KeyError for any other dtype (float32 included).
Q_DTYPES = (torch.float16, torch.bfloat16)
KV_DTYPES = (*Q_DTYPES, torch.float8_e4m3fn, torch.float8_e5m2)
# decode.py _BATCH_DECODE_PLAN_LEGACY_POS_ARGS: plan()'s deprecated positional arguments after page_size.
DECODE_LEGACY_POSITIONAL = ("pos_encoding_mode", "window_left", "logits_soft_cap", "q_data_type", "kv_data_type",
                            "o_data_type", "data_type", "sm_scale", "rope_scale", "rope_theta", "non_blocking",
                            "block_tables", "seq_lens", "fixed_split_size", "disable_split_kv", "q_len_per_req")


def check_workspace(workspace: torch.Tensor, kv_layout: str) -> None:
    """utils.py _check_workspace_buffer_alignment and _check_kv_layout, as both constructors call them."""
    if workspace.numel() and workspace.data_ptr() % 16:
        raise ValueError(f"float_workspace_buffer must be 16-byte aligned, got data_ptr % 16 = "
                         f"{workspace.data_ptr() % 16}")
    if kv_layout not in ("NHD", "HND"):
        raise KeyError(f"Invalid kv_layout {kv_layout}")


def graph_batch(buffers: dict[str, Any], device: torch.device) -> int:
    """The fixed batch size of a graph-mode wrapper, from its buffers (decode.py / prefill.py
    __init__: tensors, sized batch + 1 or batch). Its kernels read them as int32 memory on the
    workspace's device (checked by the real one only at run(), or not at all)."""
    for name, buf in buffers.items():
        if not torch.is_tensor(buf):
            raise ValueError(f"{name} should be a torch.Tensor in cudagraph mode")
    qo = buffers.get("qo_indptr")
    batch = len(qo) - 1 if qo is not None else len(buffers["last_page_len"])
    for name, n in (("qo_indptr", batch + 1), ("kv_indptr", batch + 1), ("last_page_len", batch)):
        if name in buffers and len(buffers[name]) != n:
            raise ValueError(f"The size of the {name} buffer should be {n} (batch size {batch})")
    for name, buf in buffers.items():
        check_index(f"the {name} buffer", buf)
        check_on(f"the {name} buffer", buf, device)
    return batch


def merge_legacy_positional(args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
    """decode.py _merge_deprecated_plan_kwargs (and its DeprecationWarning): optional arguments
    after page_size given by position, named in DECODE_LEGACY_POSITIONAL's order."""
    api = "BatchDecodeWithPagedKVCacheWrapper.plan()"
    if len(args) > len(DECODE_LEGACY_POSITIONAL):
        raise TypeError(f"{api} accepts at most {len(DECODE_LEGACY_POSITIONAL)} deprecated optional positional "
                        f"arguments after page_size; got {len(args)}")
    merged = dict(kwargs)
    for name, value in zip(DECODE_LEGACY_POSITIONAL, args):
        if name in merged:
            raise TypeError(f"{api} got multiple values for argument {name!r}")
        merged[name] = value
    warnings.warn(f"Passing optional arguments to {api} positionally is deprecated; pass them as keyword "
                  "arguments instead.", DeprecationWarning, stacklevel=3)
    return merged


def canonical_dtype(dtype: str | torch.dtype) -> torch.dtype:
    """utils.py canonicalize_torch_dtype."""
    if isinstance(dtype, str):
        return getattr(torch, dtype)
    if isinstance(dtype, torch.dtype):
        return dtype
    raise TypeError(f"dtype must be a string or torch.dtype, got {type(dtype)}")


def plan_dtypes(q_data_type: Any, kv_data_type: Any, o_data_type: Any) -> tuple[torch.dtype, ...]:
    """(q, kv, o) as plan() resolves them (kv and o default to q), KeyError for one without kernels
    (the real plan's module lookup, jit/attention/modules.py get_batch_*_uri, indexes the maps)."""
    q = canonical_dtype(q_data_type)
    kv = q if kv_data_type is None else canonical_dtype(kv_data_type)
    o = q if o_data_type is None else canonical_dtype(o_data_type)
    for what, dtype, known in (("q", q, Q_DTYPES), ("kv", kv, KV_DTYPES), ("o", o, Q_DTYPES)):
        if dtype not in known:
            raise KeyError(f"FlashInfer has no kernels for {what} dtype {dtype}")
    return q, kv, o


def check_heads(num_qo_heads: int, num_kv_heads: int, cuda_core_decode: bool) -> None:
    """include/flashinfer/attention/scheduler.cuh PrefillPlan (prefill and tensor-core decode)
    raises for a group that is not whole; the CUDA-core decode divides and dispatches the quotient
    (decode.cuh), so there a ragged group would silently read the wrong KV heads."""
    if num_kv_heads <= 0 or num_qo_heads % num_kv_heads:
        raise RuntimeError(f"num_qo_heads {num_qo_heads} should be divisible by num_kv_heads {num_kv_heads}")
    if cuda_core_decode and num_qo_heads // num_kv_heads not in CUDA_CORE_GROUPS:
        raise RuntimeError(f"Unsupported group_size: {num_qo_heads // num_kv_heads}")


def check_index(name: str, t: Any) -> None:
    """A 1-D int32 tensor: the kernels read indptrs, page ids and last-page lengths as int32
    (csrc/batch_decode.cu: CHECK_INPUT_TYPE(..., dl_int32) in plan and run; the prefill kernels
    take their index type from the indptr's dtype, and an int64 one would read our int32 page
    list wrongly, besides having no prebuilt kernels)."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} should be a torch.Tensor, got {type(t).__name__}")
    if t.dtype != torch.int32:
        raise RuntimeError(f"Inconsistency of Tensor type: {name} is {t.dtype}, the kernels take torch.int32")
    if t.dim() != 1:
        raise ValueError(f"{name} should be 1-D, got shape {tuple(t.shape)}")


def check_layout(kv_indptr: list[int], last_page_len: list[int], num_indices: int, page_size: int,
                 qo_indptr: list[int] | None = None) -> None:
    """The batch's page layout, as the kernels read it without checking: request i owns pages
    indices[kv_indptr[i]:kv_indptr[i+1]], the last holding last_page_len[i] tokens (page.py
    get_seq_lens). Lengths that disagree, a decreasing indptr or too short a page list make the
    kernels read out of bounds."""
    batch = len(last_page_len)
    for name, ptr in (("kv_indptr", kv_indptr), ("qo_indptr", qo_indptr)):
        if ptr is None:
            continue
        if len(ptr) != batch + 1:
            raise ValueError(f"{name} has {len(ptr)} entries for a batch of {batch}: it needs batch + 1")
        if any(b < a for a, b in zip(ptr, ptr[1:])):
            raise ValueError(f"{name} should be non-decreasing, got {ptr}")
    if any(b == a for a, b in zip(kv_indptr, kv_indptr[1:])):
        raise ValueError(f"every request needs a page (its last one holds last_page_len), got kv_indptr {kv_indptr}")
    if batch and num_indices < kv_indptr[-1]:
        raise ValueError(f"{num_indices} page indices for kv_indptr[-1] = {kv_indptr[-1]}")
    if any(not 1 <= n <= page_size for n in last_page_len):
        raise ValueError(f"last_page_len should be within [1, page_size={page_size}], got {last_page_len}")


def check_on(name: str, t: torch.Tensor, device: torch.device) -> None:
    """The kernels run on the workspace's device and take raw pointers: a tensor elsewhere would
    be read as device memory (no copy is made in run(); see prefill.py run, decode.py run)."""
    if t.device != device:
        raise ValueError(f"{name} is on {t.device}, the workspace on {device}")


def unpack_kv(paged_kv_cache: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """utils.py _unpack_paged_kv_cache for NHD: a tuple of two 4-D [pages, page_size, heads, dim]
    tensors (3-D when page_size is 1) or one 5-D [pages, 2, page_size, heads, dim] tensor."""
    if isinstance(paged_kv_cache, tuple):
        k, v = paged_kv_cache
        return _expand_4d(k), _expand_4d(v)
    if isinstance(paged_kv_cache, torch.Tensor):
        if paged_kv_cache.dim() != 5:
            raise ValueError("paged_kv_cache must be 5D")
        k, v = paged_kv_cache.unbind(dim=1)
        return k, v
    raise KeyError(f"Unrecognized paged_kv_cache type {type(paged_kv_cache)}, "
                   "expect a single tensor or a tuple of tensor.")


def _expand_4d(x: torch.Tensor) -> torch.Tensor:
    if x.dim() not in (3, 4):
        raise ValueError("x must be 3D or 4D")
    return x.unsqueeze(-3) if x.dim() == 3 else x


def check_kv(k: torch.Tensor, v: torch.Tensor, plan: dict[str, Any], device: torch.device) -> None:
    """The paged cache against the plan: dtype (utils.py _check_cached_qkv_data_type), NHD shape
    (the kernels take page_size and heads from it, decode.py/prefill.py run and the .cu run
    functions), K and V strides equal (batch_decode.cu: one set of strides addresses both)."""
    for name, t in (("k", k), ("v", v)):
        if t.dtype != plan["kv_data_type"]:
            raise ValueError(f"The dtype of {name} {t.dtype} does not match the kv_data_type "
                             f"{plan['kv_data_type']} specified in plan function.")
        check_on(f"the {name} cache", t, device)
        want = (plan["page_size"], plan["num_kv_heads"], plan["head_dim"])
        if tuple(t.shape[1:]) != want:
            raise ValueError(f"the {name} cache is {tuple(t.shape)}, the plan needs NHD [pages, *{want}]")
        if t.stride(-1) != 1:
            raise ValueError(f"the {name} cache must be contiguous in its last dimension")
    if k.shape != v.shape or k.stride() != v.stride():
        raise RuntimeError(f"K/V shapes or strides differ: {tuple(k.shape)} {k.stride()}, "
                           f"{tuple(v.shape)} {v.stride()}")


def check_q(q: Any, plan: dict[str, Any], rows: int, device: torch.device) -> None:
    """q [rows, num_qo_heads, head_dim] in the planned dtype on the workspace's device: the dtype
    as utils.py _check_cached_qkv_data_type checks it; the rows as prefill.py run checks them
    against qo_indptr[-1] (decode.py run: batch_size * q_len_per_req); heads and head size are
    what the planned kernel and its schedule were made for."""
    if not isinstance(q, torch.Tensor):
        raise TypeError(f"q should be a torch.Tensor, got {type(q).__name__}")
    if q.dtype != plan["q_data_type"]:
        raise ValueError(f"The dtype of q {q.dtype} does not match the q_data_type {plan['q_data_type']} "
                         "specified in plan function.")
    check_on("q", q, device)
    want = (rows, plan["num_qo_heads"], plan["head_dim"])
    if tuple(q.shape) != want:
        raise ValueError(f"q is {tuple(q.shape)}, the plan needs [tokens, num_qo_heads, head_dim] = {want}")
    if q.stride(-1) != 1:
        raise ValueError("q must be contiguous in its last dimension")


def check_out(out: torch.Tensor, q: torch.Tensor, dtype: torch.dtype) -> None:
    """utils.py check_shape_dtype_device, as run() applies it to a given `out`."""
    if out.shape != q.shape or out.dtype != dtype or out.device != q.device:
        raise ValueError(f"Invalid out: {tuple(out.shape)} {out.dtype} {out.device}, "
                         f"expected {tuple(q.shape)} {dtype} {q.device}")


def not_emulated(where: str, nones: dict[str, Any], **given: tuple[Any, Any]) -> None:
    """NotImplementedError for an argument the stand-in does not compute (legal in FlashInfer, but
    the stand-in's attention would silently ignore it): one of `nones` that is not None, or one of
    `given` (value, default) that is not its default."""
    for name, value in nones.items():
        if value is not None:
            raise NotImplementedError(f"the FlashInfer stand-in does not emulate {where}({name}=...)")
    for name, (value, default) in given.items():
        if value != default:
            raise NotImplementedError(f"the FlashInfer stand-in does not emulate {where}({name}={value!r})")
