"""Stand-ins for FlashInfer's fused per-token kernels (0.6.18.post1: flashinfer/norm, activation.py,
rope.py, sampling.py), with their signatures and the checks they make, computed in torch the way
the kernels compute: fp32 inside, one rounding to the activation dtype (the sampler: an exact draw
from the jointly filtered distribution, per-row Philox streams standing as per-row generators).
Each first loads its kernel module as FlashInfer's does (a no-op unless the JIT stand-in is
installed). tests/kernels/fake_flashinfer.py puts them on the stand-in module."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from tests.kernels.fake_flashinfer_jit import load_for_call

HALF_DTYPES = (torch.float16, torch.bfloat16)  # DISPATCH_PYTORCH_DTYPE_TO_CTYPE_FP16


def _check_half(name: str, t: torch.Tensor) -> None:
    if t.dtype not in HALF_DTYPES:
        raise TypeError(f"{name}: FlashInfer's kernel has no {t.dtype} instance")


def _norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * weight.float()).to(x.dtype)


def rmsnorm(input: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6, out: torch.Tensor | None = None,
            enable_pdl: bool | None = None) -> torch.Tensor:
    load_for_call("flashinfer.norm.get_norm_module")
    _check_half("rmsnorm", input)
    if input.dim() not in (2, 3) or input.stride(-1) != 1 or weight.shape != input.shape[-1:]:
        raise ValueError(f"rmsnorm: input {tuple(input.shape)}, weight {tuple(weight.shape)}")
    result = _norm(input, weight, eps)
    if out is None:
        return result
    out.copy_(result)
    return out


def fused_add_rmsnorm(input: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6,
                      enable_pdl: bool | None = None) -> None:
    """residual += input; input = norm(residual) * weight (both in place)."""
    load_for_call("flashinfer.norm.get_norm_module")
    _check_half("fused_add_rmsnorm", input)
    if input.dim() != 2 or input.shape != residual.shape or not (input.is_contiguous() and residual.is_contiguous()):
        raise ValueError(f"fused_add_rmsnorm: input {tuple(input.shape)}, residual {tuple(residual.shape)}")
    if residual.dtype != input.dtype:
        raise TypeError("fused_add_rmsnorm: residual and input dtypes differ")
    summed = (input.float() + residual.float()).to(input.dtype)  # the kernel stores the sum rounded
    residual.copy_(summed)
    input.copy_(_norm(summed, weight, eps))


def silu_and_mul(input: torch.Tensor, out: torch.Tensor | None = None, enable_pdl: bool | None = None
                 ) -> torch.Tensor:
    load_for_call("flashinfer.activation.get_act_and_mul_module", "silu")
    _check_half("silu_and_mul", input)
    if input.shape[-1] * input.dtype.itemsize % 16 != 0:
        raise ValueError("The pointers must be multiple of 16 bytes.")
    gate, up = input.float().chunk(2, dim=-1)
    result = (F.silu(gate) * up).to(input.dtype)
    if out is None:
        return result
    out.copy_(result)
    return out


def apply_rope_with_cos_sin_cache_inplace(positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor,
                                          head_size: int, cos_sin_cache: torch.Tensor, is_neox: bool = True) -> None:
    load_for_call("flashinfer.rope.get_rope_module")
    if cos_sin_cache.dtype != torch.float32:
        raise ValueError("cos_sin_cache should be float32")
    if positions.dtype not in (torch.int32, torch.int64) or positions.shape != query.shape[:1] != key.shape[:1]:
        raise ValueError(f"positions {positions.dtype} {tuple(positions.shape)}")
    if not is_neox:
        raise NotImplementedError("the stand-in rotates the neox (rotate_half) layout only")
    rotary_dim = cos_sin_cache.shape[1]
    cos, sin = cos_sin_cache.index_select(0, positions.long()).chunk(2, dim=-1)  # [T, rotary_dim / 2] each
    for x in (query, key):
        _check_half("apply_rope_with_cos_sin_cache_inplace", x)
        heads = x.view(x.shape[0], -1, head_size)  # raises, as in FlashInfer, when a row cannot be viewed so
        part = heads[..., :rotary_dim].float()
        x1, x2 = part.chunk(2, dim=-1)
        c, s = cos[:, None], sin[:, None]
        heads[..., :rotary_dim] = torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], dim=-1).to(x.dtype)


def top_k_top_p_sampling_from_probs(
    probs: torch.Tensor, top_k: torch.Tensor | int, top_p: torch.Tensor | float, indices: torch.Tensor | None = None,
    filter_apply_order: str = "top_k_first", deterministic: bool = True, generator: torch.Generator | None = None,
    check_nan: bool = False, seed: int | torch.Tensor | None = None, offset: int | torch.Tensor | None = None,
    return_valid: bool = False,
) -> torch.Tensor:
    """int32 [B] samples; "joint": a token is kept iff among the row's top_k and the mass before
    it (in descending order) is under top_p. Like the kernel it runs on probabilities."""
    load_for_call("flashinfer.sampling.get_sampling_module")
    with torch._C.DisableTorchFunction():  # the kernel's own work, hidden from the sync recorders
        return _sample(probs, top_k, top_p, indices, filter_apply_order, generator, seed, offset, return_valid)


def _sample(probs: torch.Tensor, top_k: torch.Tensor | int, top_p: torch.Tensor | float,
            indices: torch.Tensor | None, order: str, generator: torch.Generator | None,
            seed: int | torch.Tensor | None, offset: int | torch.Tensor | None, return_valid: bool) -> torch.Tensor:
    if indices is not None or return_valid or order != "joint":
        raise NotImplementedError("the stand-in samples with filter_apply_order='joint' only")
    if probs.dim() != 2 or probs.dtype != torch.float32:
        raise ValueError(f"probs must be fp32 [B, V], got {probs.dtype} {tuple(probs.shape)}")
    batch, vocab = probs.shape
    k = torch.as_tensor(top_k).expand(batch).to(torch.int64)
    p = torch.as_tensor(top_p, dtype=torch.float32).expand(batch)
    if bool((p > 1).any()) or bool((p <= 0).any()):
        raise ValueError("top_p must be in (0, 1]")
    vals, ids = probs.sort(dim=-1, descending=True)
    keep = (torch.arange(vocab) < k[:, None]) & ((vals.cumsum(-1) - vals) < p[:, None])
    keep[:, 0] = True
    kept = vals.masked_fill(~keep, 0.0)
    if isinstance(seed, torch.Tensor):
        shape_ok = seed.dim() == 1 and len(seed) in (1, batch)
        if seed.dtype not in (torch.int64, torch.uint64) or not shape_ok or offset is None:
            raise ValueError("seed must be an int64 [1 or B] tensor, with an offset")
        seeds = seed.expand(batch).tolist()
        picks = [torch.multinomial(kept[i], 1, generator=torch.Generator().manual_seed(seeds[i] % (1 << 63))).item()
                 for i in range(batch)]
        pick = torch.tensor(picks, dtype=torch.int64)
    else:
        on_cpu = generator if generator is not None and generator.device.type == "cpu" else None
        pick = torch.multinomial(kept, 1, generator=on_cpu).squeeze(1)
    return ids.gather(1, pick[:, None]).squeeze(1).to(torch.int32)


FUNCTIONS = (rmsnorm, fused_add_rmsnorm, silu_and_mul, apply_rope_with_cos_sin_cache_inplace,
             top_k_top_p_sampling_from_probs)
