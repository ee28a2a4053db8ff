"""RMSNorm computed in fp32 and cast back, with the fused residual-add form used between layers.

With fused ops set (`kernels`, a kernels/fused_ops.FusedOps) a 2-D call is one fused op: our C++
CPU kernels keep the same rounding order (bit-identical in bf16), FlashInfer's on CUDA round once
in fp32. Otherwise, and for other shapes, torch ops.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

if TYPE_CHECKING:
    from kernels.fused_ops import FusedOps


class RMSNorm(nn.Module):
    def __init__(
        self, dim: int, eps: float, dtype: torch.dtype | None = None, device: torch.device | None = None
    ) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim, dtype=dtype, device=device), requires_grad=False)
        self.eps = eps
        self.normalized_shape = (dim,)
        self.kernels: FusedOps | None = None  # fused ops, when the model uses them

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None):
        """Without `residual`: norm(x). With it: (norm(x + residual), x + residual), as in SGLang.

        The add happens in the activation dtype (as in HF); the normalization in fp32.
        """
        if self.kernels is not None and x.dim() == 2 and x.is_contiguous():
            out, summed = self.kernels.rms_norm(x, residual, self.weight, self.eps)
            return out if residual is None else (out, summed)
        if residual is None:
            return self._norm(x)
        x = x + residual
        return self._norm(x), x

    def _norm(self, x: torch.Tensor) -> torch.Tensor:
        # Same numbers as HF's (fp32 normalize, cast, then scale), in fewer ops.
        return F.rms_norm(x.float(), self.normalized_shape, None, self.eps).to(x.dtype) * self.weight
