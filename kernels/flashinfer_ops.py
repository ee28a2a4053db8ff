"""The decoder layer's per-token ops on FlashInfer's fused CUDA kernels, as SGLang runs them:
`fused_add_rmsnorm` (residual += x; x = norm(residual) * w, in place: one kernel for the add and
the norm), `rmsnorm`, `silu_and_mul`, and `apply_rope_with_cos_sin_cache_inplace` (q and k
rotated in place from an fp32 cos/sin cache indexed by position). They replace about 14 torch
kernels per layer (fp32 casts, the add, cat/mul/addcmul for the rotary, SiLU and the product).

Numbers: FlashInfer normalizes and scales in fp32 and rounds once, and rotates with fp32 cos/sin,
where the torch ops (HF's order) round the normalized value before the weight and use cos/sin in
the activation dtype: at most a rounding step apart per element. The GPU check compares the whole
model against the torch backend with these ops (scripts/gpu_check.py). Imported with the
FlashInfer backend only (CUDA); on CPU the tests drive it over tests/kernels/fake_flashinfer_ops.py.
"""

from __future__ import annotations

from typing import Any

import torch

from kernels.rotary import RotaryEmbedding, RotaryRows


class FlashInferFusedOps:
    """FusedOps (kernels/fused_ops.py) over the `flashinfer` module."""

    def __init__(self, flashinfer: Any, rotary: RotaryEmbedding) -> None:
        self.fi = flashinfer
        self.head_dim = rotary.head_dim
        self.cos_sin_cache = rotary.cos_sin_half_fp32()  # [max_positions, head_dim]: cos half, sin half

    def rms_norm(self, x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor, eps: float
                 ) -> tuple[torch.Tensor, torch.Tensor | None]:
        if residual is None:
            return self.fi.rmsnorm(x, weight, eps), None
        self.fi.fused_add_rmsnorm(x, residual, weight, eps)  # residual += x; x = norm(residual) * weight
        return x, residual

    def silu_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.fi.silu_and_mul(gate_up)
        return out

    def rotary(self, qk: torch.Tensor, rows: RotaryRows) -> torch.Tensor:
        """Every head turns by the same angles, so the split FlashInfer's API asks for (a q and a
        k tensor, each [T, heads * head_dim] with unit stride inside a row) is taken after the
        first head: "q" is head 0, "k" the rest. Both are views of qk, rotated in place."""
        tokens, heads, dim = qk.shape
        first = qk[:, :1].view(tokens, dim)
        rest = qk[:, 1:].view(tokens, (heads - 1) * dim)
        self.fi.apply_rope_with_cos_sin_cache_inplace(rows.positions, first, rest, dim, self.cos_sin_cache,
                                                      is_neox=True)
        return qk
