"""Verifying speculative drafts against the target model's logits, without changing what it
samples.

For drafts d_1..d_k after a request's last token, one forward gives logits rows r_0..r_k (row i
predicts the token after d_i; r_0 after the last token). With p_i the distribution the sampler
would draw from at row i (temperature, then top-k / top-p / min-p, renormalized), draft d_{i+1}
is accepted with probability p_i(d_{i+1}); at the first rejection the token is drawn from p_i
without d_{i+1} (renormalized), and when all k are accepted a bonus token is drawn from p_k.
A draft that is a fixed token (n-gram lookup: q is a point mass) makes this the standard
speculative-sampling rule, so every emitted token is distributed exactly as without drafts.
Greedy rows are the point-mass case of p: a draft is accepted iff it is the argmax.
"""

from __future__ import annotations

import torch

from kernels.sampling import filter_support
from runtime.contracts.sampling import SamplingParams


def target_probs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """[R, V] fp32 logits -> the [R, V] distributions the sampler draws each row from."""
    probs = torch.softmax(logits.float() / params.temperature, dim=-1)
    rows = probs.shape[0]
    keep = filter_support(
        probs,
        torch.full((rows,), params.top_k, dtype=torch.int64, device=probs.device),
        torch.full((rows,), params.top_p, device=probs.device),
        torch.full((rows,), params.min_p, device=probs.device),
    )
    probs = probs * keep
    return probs / probs.sum(dim=-1, keepdim=True)


def accept_greedy(best: list[int], drafts: list[int]) -> tuple[int, int]:
    """Greedy verification from each row's argmax `best` (k + 1 of them): (accepted, next)."""
    accepted = next((i for i, d in enumerate(drafts) if best[i] != d), len(drafts))
    return accepted, best[accepted]


def verify_drafts(logits: torch.Tensor, drafts: list[int], params: SamplingParams,
                  generator: torch.Generator | None = None) -> tuple[int, int]:
    """(how many drafts are accepted, the token that follows them) for one request's k + 1
    logits rows (fp32 [k + 1, V]) and its k drafts."""
    k = len(drafts)
    assert logits.shape[0] == k + 1, (logits.shape, k)
    if params.is_greedy:
        return accept_greedy(logits.argmax(dim=-1).tolist(), drafts)
    probs = target_probs(logits, params)
    ids = torch.tensor(drafts, dtype=torch.int64, device=probs.device)
    p_draft = probs[:k].gather(1, ids.unsqueeze(1)).squeeze(1)
    u = torch.rand(k, generator=generator, device=probs.device)
    rejected = (u >= p_draft).tolist()
    accepted = next((i for i in range(k) if rejected[i]), k)
    row = probs[accepted].clone()
    if accepted < k:
        row[drafts[accepted]] = 0.0  # the residual max(p - q, 0) of a point-mass draft
    return accepted, int(torch.multinomial(row, 1, generator=generator).item())
