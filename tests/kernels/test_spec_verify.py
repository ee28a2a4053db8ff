"""Speculative verification keeps the sampler's distribution: for constructed logits rows and
drafts the target gives probability 0.3-0.7, thousands of verifications emit token sequences
distributed exactly as sequential sampling would (chi-square against the exact distribution,
which is computed here from the logits, not by the module under test), and never a sequence
sequential sampling cannot produce; greedy accepts exactly the argmax prefix."""

from __future__ import annotations

import math

import pytest
import torch

from kernels.spec_verify import verify_drafts
from runtime.contracts.sampling import SamplingParams

DRAWS = 3000
VOCAB = 12


def logits_from(raw: list[float], temperature: float) -> list[float]:
    """A logits row whose softmax at `temperature` is `raw` (padded evenly to VOCAB tokens)."""
    rest = (1.0 - sum(raw)) / (VOCAB - len(raw))
    assert rest > 0
    return [temperature * math.log(p) for p in raw + [rest] * (VOCAB - len(raw))]


def reference_probs(logits: list[float], params: SamplingParams) -> list[float]:
    """What the sampler draws from, written out: softmax at the temperature, then keep a token
    iff its rank < top_k, the mass before it (in descending order) < top_p and p >= min_p * max p
    (the top token always), renormalized."""
    exps = [math.exp(x / params.temperature) for x in logits]
    raw = [e / sum(exps) for e in exps]
    order = sorted(range(len(raw)), key=lambda t: -raw[t])
    kept, before = [0.0] * len(raw), 0.0
    for rank, t in enumerate(order):
        in_k = params.top_k < 1 or rank < params.top_k
        if rank == 0 or (in_k and before < params.top_p and raw[t] >= params.min_p * raw[order[0]]):
            kept[t] = raw[t]
        before += raw[t]
    return [p / sum(kept) for p in kept]


def exact_outcomes(rows: list[list[float]], drafts: list[int]) -> dict[tuple[int, ...], float]:
    """The probability of each emitted sequence (accepted drafts, then one token) when every token
    is sampled from its row in turn and the verification stops at the first that is not the draft."""
    table: dict[tuple[int, ...], float] = {}
    reach = 1.0
    for i, row in enumerate(rows):
        for t, p in enumerate(row):
            if p > 0 and (i == len(drafts) or t != drafts[i]):
                table[tuple(drafts[:i]) + (t,)] = reach * p
        if i < len(drafts):
            reach *= row[drafts[i]]
    return table


def critical(df: int) -> float:
    """Chi-square's critical value at p = 0.001 (Wilson-Hilferty)."""
    z = 3.09
    return df * (1 - 2 / (9 * df) + z * (2 / (9 * df)) ** 0.5) ** 3


# Each row's softmax at the temperature (padded evenly); the drafts are tokens 0 and 1. Every
# case's filter drops tokens that carry real mass before it, so ignoring it would be seen.
CASES = {
    "top_k": (SamplingParams(temperature=0.7, top_k=3),
              [[0.30, 0.20, 0.12, 0.11, 0.10], [0.15, 0.25, 0.20, 0.14], [0.20, 0.10, 0.30, 0.15]]),
    "top_p": (SamplingParams(temperature=1.3, top_p=0.75),
              [[0.40, 0.25, 0.15, 0.08], [0.25, 0.40, 0.12, 0.10], [0.30, 0.30, 0.20, 0.15]]),
    "min_p": (SamplingParams(temperature=1.0, min_p=0.3),
              [[0.35, 0.20, 0.12, 0.10], [0.20, 0.30, 0.15, 0.07], [0.30, 0.20, 0.25, 0.08]]),
    "temperature": (SamplingParams(temperature=0.5),
                    [[0.40, 0.25, 0.20], [0.20, 0.40, 0.25], [0.40, 0.20, 0.15]]),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_emitted_tokens_are_distributed_as_sequential_sampling(case: str) -> None:
    params, raws = CASES[case]
    drafts = [0, 1]
    logits = torch.tensor([logits_from(raw, params.temperature) for raw in raws])
    rows = [reference_probs(row, params) for row in logits.tolist()]
    assert all(0.3 <= rows[i][d] <= 0.7 for i, d in enumerate(drafts)), rows
    table = exact_outcomes(rows, drafts)
    gen = torch.Generator().manual_seed(len(case))
    counts: dict[tuple[int, ...], int] = {}
    for _ in range(DRAWS):
        accepted, nxt = verify_drafts(logits, drafts, params, gen)
        outcome = tuple(drafts[:accepted]) + (nxt,)
        counts[outcome] = counts.get(outcome, 0) + 1
    impossible = {o: n for o, n in counts.items() if o not in table}
    assert not impossible, impossible  # e.g. a token outside the support, or a rejected draft emitted
    assert min(table.values()) * DRAWS >= 5  # every bin counts: none is dropped
    stat = sum((counts.get(o, 0) - p * DRAWS) ** 2 / (p * DRAWS) for o, p in table.items())
    assert stat < critical(len(table) - 1), (stat, len(table) - 1, counts, table)


def test_greedy_accepts_the_argmax_prefix() -> None:
    logits = torch.full((4, 10), -5.0)
    for row, best in enumerate([4, 2, 9, 1]):
        logits[row, best] = 5.0
    greedy = SamplingParams(temperature=0.0)
    assert verify_drafts(logits, [4, 2, 9], greedy) == (3, 1)
    assert verify_drafts(logits, [4, 3, 9], greedy) == (1, 2)
    assert verify_drafts(logits, [0, 2, 9], greedy) == (0, 4)
