"""Speculative verification keeps the sampler's distribution: Monte Carlo over many draws of
the first emitted token, for drafts that are likely, unlikely and outside the support, against
the exact distribution (chi-square); greedy accepts exactly the argmax prefix."""

from __future__ import annotations

import pytest
import torch

from kernels.spec_verify import target_probs, verify_drafts
from runtime.sampling import SamplingParams

DRAWS = 2000


def chi_square(counts: torch.Tensor, probs: torch.Tensor, draws: int) -> tuple[float, int]:
    expected = probs * draws
    keep = expected >= 5
    stat = (((counts - expected) ** 2) / expected.clamp(min=1e-9))[keep].sum().item()
    return stat, int(keep.sum()) - 1


# Critical values of chi-square at p = 0.001 for the degrees of freedom that occur here.
def critical(df: int) -> float:
    z = 3.09  # one-sided 0.001
    return df * (1 - 2 / (9 * df) + z * (2 / (9 * df)) ** 0.5) ** 3  # Wilson-Hilferty


@pytest.mark.parametrize("params", [SamplingParams(temperature=0.7, top_k=6),
                                    SamplingParams(temperature=1.2, top_p=0.8)])
@pytest.mark.parametrize("draft_rank", [0, 3, 15])  # the most likely token, a plausible one, a rare one
def test_first_emitted_token_keeps_the_distribution(params: SamplingParams, draft_rank: int) -> None:
    gen = torch.Generator().manual_seed(draft_rank)
    logits = torch.randn(3, 16, generator=gen) * 1.5
    p0 = target_probs(logits[:1], params)[0]
    draft = int(p0.argsort(descending=True)[draft_rank])
    counts = torch.zeros(16)
    for _ in range(DRAWS):
        accepted, nxt = verify_drafts(logits, [draft, 7], params, gen)
        counts[draft if accepted else nxt] += 1
    stat, df = chi_square(counts, p0, DRAWS)
    assert stat < critical(df), (stat, df)


def test_second_token_after_an_accepted_draft_keeps_its_distribution() -> None:
    params = SamplingParams(temperature=1.0)
    gen = torch.Generator().manual_seed(1)
    logits = torch.randn(3, 12, generator=gen)
    p0, p1 = target_probs(logits[:2], params)
    draft0 = int(p0.argmax())
    counts = torch.zeros(12)
    seen = 0
    for _ in range(DRAWS):
        accepted, nxt = verify_drafts(logits, [draft0, 3], params, gen)
        if accepted >= 1:
            seen += 1
            counts[3 if accepted == 2 else nxt] += 1
    stat, df = chi_square(counts, p1, seen)
    assert stat < critical(df), (stat, df)


def test_greedy_accepts_the_argmax_prefix() -> None:
    logits = torch.full((4, 10), -5.0)
    for row, best in enumerate([4, 2, 9, 1]):
        logits[row, best] = 5.0
    greedy = SamplingParams(temperature=0.0)
    assert verify_drafts(logits, [4, 2, 9], greedy) == (3, 1)
    assert verify_drafts(logits, [4, 3, 9], greedy) == (1, 2)
    assert verify_drafts(logits, [0, 2, 9], greedy) == (0, 4)
