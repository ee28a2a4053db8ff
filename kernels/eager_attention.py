"""Attention as two matmuls and a softmax, with optional logit soft-capping (Gemma 2).

SDPA cannot cap the scores, so a soft-capped model's attention runs here on the torch paths, in
Hugging Face's eager order: scores in the activation dtype, scaled, capped, masked, then an fp32
softmax rounded back to the activation dtype before the product with V.
"""

from __future__ import annotations

import torch


def eager_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, scale: float,
                    softcap: float | None) -> torch.Tensor:
    """q [.., Lq, D], k and v [.., Lk, D] (broadcastable leading dims), an additive mask
    broadcastable to [.., Lq, Lk] (-inf where hidden) -> [.., Lq, D] in q's dtype."""
    scores = torch.matmul(q, k.transpose(-1, -2)) * scale
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    if mask is not None:
        scores = scores + mask
    probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
    return torch.matmul(probs, v)
