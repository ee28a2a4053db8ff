"""The per-token ops a decoder layer can run fused: RMSNorm with the residual add, SiLU(gate) * up,
and the rotary embedding of q and k. A model runs them as plain torch ops unless it is given a
`FusedOps` (`CausalLM.use_fused_ops`): our C++ kernels on CPU (`CpuFusedOps`), FlashInfer's CUDA
kernels with the FlashInfer backend (kernels/flashinfer_ops.py). The torch ops are the oracle.
"""

from __future__ import annotations

from types import ModuleType
from typing import Protocol

import torch

from kernels.rotary import RotaryRows


class FusedOps(Protocol):
    def rms_norm(self, x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor, eps: float
                 ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """x [T, D] contiguous: (norm(x + residual), x + residual), or (norm(x), anything) without
        a residual. May reuse x's and the residual's memory (the caller drops both)."""
        ...

    def silu_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        """[T, 2I] -> SiLU(gate) * up [T, I]."""
        ...

    def rotary(self, qk: torch.Tensor, rows: RotaryRows) -> torch.Tensor:
        """qk [T, heads, head_dim] (q's heads then k's, possibly a strided view) rotated by the
        angles of its tokens' positions; may rotate in place."""
        ...


class CpuFusedOps:
    """Our C++ CPU kernels (runtime/execution/cpu_kernels.py), same roundings as the torch ops."""

    def __init__(self, ext: ModuleType) -> None:
        self.ext = ext

    def rms_norm(self, x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor, eps: float
                 ) -> tuple[torch.Tensor, torch.Tensor | None]:
        out, summed = self.ext.rms_norm(x, residual, weight, eps)
        return out, summed

    def silu_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.ext.silu_mul(gate_up)
        return out

    def rotary(self, qk: torch.Tensor, rows: RotaryRows) -> torch.Tensor:
        out: torch.Tensor = self.ext.rotary(qk, rows.table)
        return out
