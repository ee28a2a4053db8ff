"""Cascade attention on CPU: a KV prefix shared by every decode row is attended to once.

Requests that share a cached prefix (a system prompt, an agent's history, vLLM's random-prefix
benchmark) hold the *same* KV slots for it. Gathering and attending that prefix once per request
repeats the same memory traffic B times, with a query of `group` rows each, which SDPA's CPU
kernel runs far below its speed. Instead:

    shared part:  all B * group query rows of a KV head against the shared prefix, in one call;
    own part:     each request's query rows against its own tokens (padded, masked) as usual;
    merge:        the two softmax-normalised results weighted by their log-sum-exps,

which is exact up to rounding (FlashInfer's cascade/merge_state does the same on the GPU).
"""

from __future__ import annotations

import torch

_flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu


def common_prefix_len(padded: torch.Tensor, limit: int) -> int:
    """Leading columns of `padded` [B, L] (each request's KV slots) equal in every row, at most
    `limit`."""
    if limit <= 0:
        return 0
    same = (padded[:, :limit] == padded[:1, :limit]).all(dim=0)
    return int(same.to(torch.int32).cumprod(dim=0).sum())


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None,
           scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(output [.., Lq, D] in q's dtype, log-sum-exp [.., Lq] fp32); 4-D inputs, additive mask."""
    return _flash(q, k, v, 0.0, False, attn_mask=mask, scale=scale)


def merge(out_a: torch.Tensor, lse_a: torch.Tensor, out_b: torch.Tensor, lse_b: torch.Tensor) -> torch.Tensor:
    """Attention over the union of two disjoint key sets from the attention over each."""
    top = torch.maximum(lse_a, lse_b)
    w_a = (lse_a - top).exp_().unsqueeze(-1)
    w_b = (lse_b - top).exp_().unsqueeze(-1)
    merged = (out_a.float() * w_a + out_b.float() * w_b) / (w_a + w_b)
    return merged.to(out_a.dtype)
