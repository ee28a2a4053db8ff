"""Speculative decoding end to end in the scheduler: sampled outputs of the default model keep
their distribution (two-sample chi-square on the 2nd and 3rd tokens of many runs of a prompt
whose continuation the drafts often guess); on the tiny model, an abort mid-run frees
everything and ineligible requests decode plainly beside speculating ones."""

from __future__ import annotations

from collections import Counter

import torch

from runtime.messages import AbortReq
from tests.scheduler.harness import make, run_until_idle, submit

PROMPT = list(range(3, 300)) + list(range(3, 40))  # every token occurs: a draft always exists
ALPHABET = " ".join("abcdefghijklmnopqrstuvwxyz") + " " + " ".join("abcdefghij")  # continues " k l m"
SAMPLES = 300
SPEC = dict(speculative_algorithm="ngram", speculative_disable_by_batch_size=1024, max_running_requests=128,
            max_total_tokens=131072)


def sampled_tokens(model: str, seed: int, **spec) -> list[list[int]]:
    from transformers import AutoTokenizer

    prompt = AutoTokenizer.from_pretrained(model).encode(ALPHABET)
    torch.manual_seed(seed)  # the runner's unseeded rows draw from the global generator
    sched, io = make(model, **{**dict(max_running_requests=128, max_total_tokens=131072), **spec})
    for i in range(SAMPLES):
        submit(io, f"s{i}", prompt, max_new_tokens=3, temperature=1.0)
    results = run_until_idle(sched, io)
    if spec:
        assert sched.speculator.steps > 0 and sched.speculator.accepted > 0
    return [results[f"s{i}"]["ids"] for i in range(SAMPLES)]


def two_sample_chi_square(a: list[int], b: list[int], top: int = 8) -> tuple[float, int]:
    """Over the `top` most frequent tokens (of both samples) and one bin for the rest."""
    ca, cb = Counter(a), Counter(b)
    keys = [t for t, _ in (ca + cb).most_common(top)]
    bins_a = [ca[t] for t in keys] + [len(a) - sum(ca[t] for t in keys)]
    bins_b = [cb[t] for t in keys] + [len(b) - sum(cb[t] for t in keys)]
    stat = sum((x - y) ** 2 / (x + y) for x, y in zip(bins_a, bins_b) if x + y)
    return stat, len(bins_a) - 1


def test_sampled_outputs_keep_their_distribution(default_model_path: str) -> None:
    plain = sampled_tokens(default_model_path, 1)
    spec = sampled_tokens(default_model_path, 2, **SPEC)
    for position in (1, 2):  # the first token comes from the prefill, the later ones from verify steps
        stat, df = two_sample_chi_square([o[position] for o in plain], [o[position] for o in spec])
        assert stat < 27.9, (position, stat, df)  # chi-square(8) at p = 0.001


def test_abort_mid_speculation_frees_everything(tiny_model: str) -> None:
    sched, io = make(tiny_model, **SPEC)
    submit(io, "long", PROMPT, max_new_tokens=200)
    submit(io, "penalized", PROMPT, max_new_tokens=20, frequency_penalty=0.5)  # not eligible: plain decode
    for _ in range(4):
        sched.step()
    io.inbox.append(AbortReq("long"))
    results = run_until_idle(sched, io)  # checks the idle invariant: no slot, row or lock held
    assert results["long"]["finish"]["type"] == "abort" and len(results["penalized"]["ids"]) == 20
    assert sched.speculator.steps > 0
