"""Rotary position embedding, "rotate_half" layout (Llama/Qwen checkpoints in HF format).

The cos/sin table is computed once in fp32 for every position up to max_position_embeddings;
a forward step looks up its positions once (`lookup`) and every layer reuses the result (`rotate`).
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import torch
from torch import nn


def inverse_frequencies(head_dim: int, theta: float, scaling: dict[str, Any] | None) -> torch.Tensor:
    """fp32 [head_dim/2] inverse frequencies, with linear or Llama-3 scaling applied."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    if scaling is None:
        return inv_freq
    if scaling["rope_type"] == "linear":
        return inv_freq / scaling["factor"]
    assert scaling["rope_type"] == "llama3", scaling
    return _llama3_scaled(inv_freq, scaling)


def _llama3_scaled(inv_freq: torch.Tensor, s: dict[str, Any]) -> torch.Tensor:
    """Llama 3.1: long wavelengths divided by `factor`, short kept, the middle band interpolated."""
    factor, low, high = s["factor"], s["low_freq_factor"], s["high_freq_factor"]
    old_len = s["original_max_position_embeddings"]
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > old_len / low, inv_freq / factor, inv_freq)
    smooth = (old_len / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    is_medium = (wavelen >= old_len / high) & (wavelen <= old_len / low)
    return torch.where(is_medium, smoothed, scaled)


def _cos_sin(head_dim: int, max_positions: int, theta: float, scaling: dict[str, Any] | None
             ) -> tuple[torch.Tensor, torch.Tensor]:
    """fp32 cos and sin [max_positions, head_dim / 2] of every position's angles."""
    freqs = torch.outer(torch.arange(max_positions, dtype=torch.float32), inverse_frequencies(head_dim, theta, scaling))
    return freqs.cos(), freqs.sin()


class RotaryRows(NamedTuple):
    """One step's rotary rows: cos and signed sin [T, 1, head_dim] (views), the rows [T, 2 * head_dim],
    and the positions [T] they were looked up at."""

    cos: torch.Tensor
    sin: torch.Tensor
    table: torch.Tensor
    positions: torch.Tensor


class RotaryEmbedding(nn.Module):
    """Holds the table [max_positions, 2 * head_dim]: cos then sign-folded sin, per position.

    The angles are computed in fp32 and the table is stored in the activation dtype, as HF does
    (cos/sin cast to q's dtype); `rotate` then costs three ops in that dtype (cat, mul, addcmul).
    """

    cos_sin: torch.Tensor  # the registered buffer

    def __init__(
        self,
        head_dim: int,
        max_positions: int,
        theta: float,
        scaling: dict[str, Any] | None = None,
        dtype: torch.dtype = torch.float32,
        device: torch.device | None = None,
    ) -> None:
        super().__init__()
        self.angles = (head_dim, max_positions, theta, scaling)
        cos, sin = _cos_sin(*self.angles)
        # rotate_half(x) * sin == cat(x2, x1) * cat(-sin, sin): fold the sign into the table.
        table = torch.cat([cos, cos, -sin, sin], dim=-1)
        self.register_buffer("cos_sin", table.to(device=device, dtype=dtype), persistent=False)
        self.head_dim = head_dim

    def cos_sin_half_fp32(self) -> torch.Tensor:
        """The fp32 table [max_positions, head_dim] of cos (first half) and sin (second half), the
        layout of FlashInfer's `apply_rope_with_cos_sin_cache_inplace`, on this table's device."""
        cos, sin = _cos_sin(*self.angles)
        return torch.cat([cos, sin], dim=-1).to(self.cos_sin.device)

    def lookup(self, positions: torch.Tensor) -> RotaryRows:
        """The table rows of the tokens at `positions` [T]: once per step, for every layer."""
        table = self.cos_sin.index_select(0, positions)
        rows = table.unsqueeze(1)
        return RotaryRows(rows[..., : self.head_dim], rows[..., self.head_dim :], table, positions)

    @staticmethod
    def rotate(x: torch.Tensor, rows: RotaryRows) -> torch.Tensor:
        """x [T, heads, head_dim] rotated by its positions' angles: x * cos + rotate_half(x) * sin.
        (Our C++ kernel `rotary(x, rows.table)` computes the same, with the same roundings.)"""
        cos, sin = rows.cos, rows.sin
        x1, x2 = x.chunk(2, dim=-1)
        return torch.addcmul(x * cos, torch.cat((x2, x1), dim=-1), sin)
