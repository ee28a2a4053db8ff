"""Top-k / top-p draws without sorting the vocabulary: FlashInfer's rejection-sampling kernel
(`top_k_top_p_sampling_from_probs`, filter order "joint": both limits on the same probabilities,
as kernels/sampling.py defines them), for the truncated row groups of a step on CUDA with the
FlashInfer backend. The torch way sorts every row's whole vocabulary there (a GPU cannot afford
the host read that would prove a narrow prefix wide enough).

Seeds keep their meaning: a seeded row draws from its own Philox stream (FlashInfer takes one
seed per row), seeded by the same mix of its seed and step as the torch way, so its token depends
on its own distribution, seed and step only (not the same token as the torch way draws). Rows
with min_p stay on the torch way (this kernel has no min_p).
"""

from __future__ import annotations

import random
from typing import Any

import torch

from kernels.transfer import upload

_SIGN64 = 1 << 63


def _signed64(seed: int) -> int:
    """A 64-bit unsigned seed as the int64 with the same bits."""
    return seed - (1 << 64) if seed >= _SIGN64 else seed


class FlashInferTruncatedSampler:
    """kernels.sampling.TruncatedSampler over the `flashinfer` module."""

    def __init__(self, flashinfer: Any) -> None:
        self.fi = flashinfer

    def __call__(self, probs: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor, seeds: list[int | None],
                 generator: torch.Generator | None) -> torch.Tensor:
        """probs fp32 [G, V]; top_k int64 [G] (V: unlimited); top_p fp32 [G] (inf: unlimited)."""
        k, p = top_k.to(torch.int32), top_p.clamp(max=1.0)
        if all(seed is None for seed in seeds):
            ids = self.fi.top_k_top_p_sampling_from_probs(probs, k, p, filter_apply_order="joint", generator=generator)
        else:
            # Unseeded rows beside seeded ones take a fresh seed from the host's RNG (no GPU read).
            row_seeds = [_signed64(s) if s is not None else random.getrandbits(63) for s in seeds]
            ids = self.fi.top_k_top_p_sampling_from_probs(
                probs, k, p, filter_apply_order="joint", seed=upload(row_seeds, torch.int64, probs.device), offset=0)
        out: torch.Tensor = ids.to(torch.int64)
        return out
