"""Batched sampling: support masks, seeded reproducibility, penalties, bias, logprobs."""

from __future__ import annotations

import math

import pytest
import torch

from kernels.sampling import (
    SamplingBatch,
    apply_penalties_and_bias,
    filter_support,
    mix_seed,
    sample,
)
from runtime.contracts.sampling import SamplingParams as SP


def run(params, logits, outs=None, stop_ids=None, generator=None, **kw):
    """One sampling step as the model runner does it; returns (output, processed logits)."""
    outs = outs if outs is not None else [[] for _ in params]
    batch = SamplingBatch.build(params, outs, logits.shape[1], logits.device, stop_ids)
    logits = logits.clone()
    apply_penalties_and_bias(logits, batch)
    return sample(logits, batch, generator=generator, **kw), logits


def support(probs, top_k=-1, top_p=1.0, min_p=0.0, width=256):
    probs = torch.tensor([probs], dtype=torch.float32)
    k, p, m = torch.tensor([top_k]), torch.tensor([top_p]), torch.tensor([min_p])
    mask = filter_support(probs, k, p, m, width)
    return set(mask[0].nonzero().flatten().tolist())


P4 = [0.5, 0.3, 0.15, 0.05]


@pytest.mark.parametrize("kw,kept", [
    ({}, {0, 1, 2, 3}),
    ({"top_p": 0.8}, {0, 1}),
    ({"top_p": 0.81}, {0, 1, 2}),
    ({"top_p": 0.5}, {0}),
    ({"top_p": 0.51}, {0, 1}),
    ({"top_p": 0.96}, {0, 1, 2, 3}),
    ({"top_p": 1e-6}, {0}),
    ({"top_k": 1}, {0}),
    ({"top_k": 3}, {0, 1, 2}),
    ({"top_k": 4}, {0, 1, 2, 3}),
    ({"top_k": 100}, {0, 1, 2, 3}),
    ({"min_p": 0.5}, {0, 1}),
    ({"min_p": 0.3}, {0, 1, 2}),
    ({"min_p": 0.61}, {0}),
    ({"min_p": 1.0}, {0}),
    ({"top_k": 3, "top_p": 0.8}, {0, 1}),
    ({"top_k": 2, "top_p": 0.95}, {0, 1}),
    ({"top_p": 0.9, "min_p": 0.5}, {0, 1}),
])
def test_support_on_hand_made_distribution(kw, kept):
    assert support(P4, **kw) == kept


def test_support_ignores_token_order():
    perm = [2, 0, 3, 1]  # probs [0.15, 0.5, 0.05, 0.3]
    probs = [P4[i] for i in perm]
    assert support(probs, top_p=0.8) == {1, 3}
    assert support(probs, top_k=3) == {0, 1, 3}
    assert support(probs, min_p=0.3) == {0, 1, 3}


def reference_support(p, k, top_p, min_p):
    order = sorted(range(len(p)), key=lambda i: -p[i])
    kept, mass = set(), 0.0
    for rank, i in enumerate(order):
        if rank < k and (top_p >= 1 or mass < top_p) and p[i] >= min_p * p[order[0]]:
            kept.add(i)
        mass += p[i]
    return kept | {order[0]}


@pytest.mark.parametrize("width", [4, 64, 5000])
def test_support_matches_reference_on_random_distributions(width):
    gen = torch.Generator().manual_seed(0)
    vocab = 700
    scales = torch.tensor([0.3, 1.0, 3.0, 8.0]).repeat(3).unsqueeze(1)
    probs = torch.softmax(torch.randn(12, vocab, generator=gen, dtype=torch.float64) * scales, -1)
    top_k = torch.tensor([-1, 5, 400, -1, 1, 50, -1, 699, 10, -1, 3, 700])
    top_p = torch.tensor([0.9, 1.0, 0.95, 0.5, 0.7, 0.99, 0.3, 1.0, 0.8, 0.999, 1.0, 0.6])
    min_p = torch.tensor([0.0, 0.0, 0.0, 0.1, 0.0, 0.01, 0.0, 0.2, 0.0, 0.0, 0.5, 0.0])
    mask = filter_support(probs, top_k, top_p, min_p, width)
    for r in range(12):
        k = vocab if top_k[r] < 1 else int(top_k[r])
        want = reference_support(probs[r].tolist(), k, float(top_p[r]), float(min_p[r]))
        assert set(mask[r].nonzero().flatten().tolist()) == want, r


def test_sampling_stays_inside_support_and_follows_probabilities():
    logits = torch.log(torch.tensor([0.4, 0.25, 0.15, 0.1, 0.06, 0.04]))
    rows = 4000
    params = [SP(top_p=0.75)] * rows  # keeps {0, 1, 2}: renormalized 0.5, 0.3125, 0.1875
    gen = torch.Generator().manual_seed(1)
    out, _ = run(params, logits.repeat(rows, 1), generator=gen)
    counts = torch.bincount(out.next_ids, minlength=6).double() / rows
    assert counts[3:].sum() == 0
    want = torch.tensor([0.5, 0.3125, 0.1875], dtype=torch.float64)
    assert torch.allclose(counts[:3], want, atol=0.03)


@pytest.mark.parametrize(
    "kw", [{"top_k": 5}, {"top_p": 0.6}, {"min_p": 0.3}, {"top_k": 40, "top_p": 0.9}]
)
def test_many_draws_never_leave_the_support(kw):
    gen = torch.Generator().manual_seed(2)
    logits = torch.randn(1, 300, generator=gen) * 2
    probs = torch.softmax(logits, -1)
    k, p, m = kw.get("top_k", -1), kw.get("top_p", 1.0), kw.get("min_p", 0.0)
    allowed = reference_support(probs[0].tolist(), 300 if k < 1 else k, p, m)
    for _ in range(5):
        out, _ = run([SP(**kw)] * 400, logits.repeat(400, 1), generator=gen)
        assert set(out.next_ids.tolist()) <= allowed


def test_unseeded_rows_use_the_callers_generator():
    logits = torch.zeros(16, 1000)
    a, _ = run([SP()] * 16, logits, generator=torch.Generator().manual_seed(5))
    b, _ = run([SP()] * 16, logits, generator=torch.Generator().manual_seed(5))
    assert torch.equal(a.next_ids, b.next_ids)


def seeded_sequence(seed, others, position, steps=8, vocab=1000, **kw):
    """Tokens the seeded row draws over `steps` steps placed among `others` at `position`."""
    gen = torch.Generator().manual_seed(123)
    row_logits = torch.randn(vocab, generator=gen)
    tokens = []
    for step in range(steps):
        params = list(others)
        params.insert(position, SP(seed=seed, **kw))
        noise = torch.randn(len(params), vocab, generator=gen) * 3
        noise[position] = row_logits
        outs = [[0] * step for _ in params]
        out, _ = run(params, noise, outs, generator=torch.Generator().manual_seed(step + 99))
        tokens.append(int(out.next_ids[position]))
    return tokens


@pytest.mark.parametrize(
    "kw", [{}, {"top_k": 50}, {"top_p": 0.9, "temperature": 0.8}, {"min_p": 0.05}]
)
def test_same_seed_same_tokens_across_batch_compositions(kw):
    alone = seeded_sequence(7, [], 0, **kw)
    mixed = [SP(temperature=0), SP(top_k=600), SP(seed=1), SP(top_p=0.5), SP(**kw)]
    assert seeded_sequence(7, mixed, 3, **kw) == alone
    assert seeded_sequence(7, [SP(top_k=1)] * 4, 4, **kw) == alone
    assert seeded_sequence(7, [SP(seed=7, **kw)], 0, **kw) == alone
    assert seeded_sequence(8, [], 0, **kw) != alone


def test_seed_stream_depends_on_step():
    assert len({mix_seed(7, s) for s in range(1000)}) == 1000
    assert mix_seed(7, 0) != mix_seed(8, 0)
    assert 0 <= mix_seed((1 << 63) - 1, 10**9) < (1 << 63)


def test_greedy_equals_argmax_and_takes_the_fast_path():
    logits = torch.randn(8, 500, generator=torch.Generator().manual_seed(3))
    params = [SP(temperature=0), SP(top_k=1, temperature=2.0)] * 4
    batch = SamplingBatch.build(params, [[]] * 8, 500, "cpu")
    assert batch.is_all_greedy and not batch.groups and batch.temperatures is None
    assert not batch.needs_logit_processing
    out = sample(logits, batch)
    assert torch.equal(out.next_ids, logits.argmax(-1))
    assert out.logprobs is None and out.top_logprobs is None


def test_repetition_frequency_presence_move_logits_by_exact_amounts():
    logits = torch.tensor([[2.0, -2.0, 1.0, 0.5, 3.0]] * 4)
    outs = [[0, 0, 1, 2]] * 4
    params = [SP(repetition_penalty=2.0), SP(frequency_penalty=0.5),
              SP(presence_penalty=0.25),
              SP(repetition_penalty=1.5, frequency_penalty=0.1, presence_penalty=0.2)]
    _, got = run(params, logits, outs)
    assert torch.allclose(got[0], torch.tensor([1.0, -4.0, 0.5, 0.5, 3.0]))
    assert torch.allclose(got[1], torch.tensor([1.0, -2.5, 0.5, 0.5, 3.0]))
    assert torch.allclose(got[2], torch.tensor([1.75, -2.25, 0.75, 0.5, 3.0]))
    want = torch.tensor([2.0 / 1.5 - 0.2 - 0.2, -3.0 - 0.1 - 0.2, 1.0 / 1.5 - 0.1 - 0.2, 0.5, 3.0])
    assert torch.allclose(got[3], want)


def test_penalties_only_touch_rows_that_ask_and_negative_penalties_reward():
    logits = torch.tensor([[1.0, 1.0, 1.0]] * 3)
    params = [SP(), SP(frequency_penalty=-1.0), SP(presence_penalty=0.5)]
    _, got = run(params, logits, [[0, 0], [0, 0], []])
    assert torch.equal(got[0], logits[0])
    assert torch.allclose(got[1], torch.tensor([3.0, 1.0, 1.0]))
    assert torch.equal(got[2], logits[2])  # no output yet: nothing to penalize


def test_logit_bias_adds():
    logits = torch.zeros(2, 6)
    params = [SP.from_dict({"logit_bias": {"1": 5, "4": -100}}), SP(logit_bias={2: 1.5})]
    out, got = run(params, logits, generator=torch.Generator().manual_seed(0))
    assert torch.equal(got[0], torch.tensor([0.0, 5.0, 0.0, 0.0, -100.0, 0.0]))
    assert torch.equal(got[1], torch.tensor([0.0, 0.0, 1.5, 0.0, 0.0, 0.0]))
    greedy, _ = run([SP(temperature=0, logit_bias={3: 0.1})], torch.zeros(1, 6))
    assert greedy.next_ids.tolist() == [3]


def test_logit_bias_is_read_once_per_request_not_per_step(monkeypatch):
    calls = []
    real = SP.logit_bias_ids
    monkeypatch.setattr(SP, "logit_bias_ids", lambda self: calls.append(1) or real(self))
    biased = SP(temperature=0, logit_bias={i: -1.0 for i in range(5)})  # the same object each step
    for step in range(10):
        rows = [SP(), biased] if step % 2 else [biased]  # its row moves between steps
        _, got = run(rows, torch.zeros(len(rows), 6))
        assert torch.equal(got[-1], torch.tensor([-1.0] * 5 + [0.0]))
    assert len(calls) == 1


def test_min_new_tokens_blocks_stop_ids_until_reached():
    logits = torch.tensor([[0.0, 0.0, 10.0, 9.0, 0.0]] * 3)
    params = [SP(temperature=0, min_new_tokens=2)] * 3
    outs = [[], [4], [4, 4]]
    stop_ids = [[2, 3], [2, 3], [2, 3]]
    out, got = run(params, logits, outs, stop_ids)
    assert out.next_ids.tolist() == [0, 0, 2]
    assert math.isinf(got[0, 2]) and math.isinf(got[1, 3]) and got[2, 2] == 10.0
    out, _ = run([SP(temperature=0, min_new_tokens=2)], logits[:1], [[]], [[3]])
    assert out.next_ids.tolist() == [2]  # only the given stop ids are blocked


def test_logprobs_are_raw_log_softmax_before_temperature():
    gen = torch.Generator().manual_seed(4)
    logits = torch.randn(4, 50, generator=gen)
    params = [SP(temperature=0), SP(temperature=0.3), SP(temperature=2.0, top_k=5), SP(seed=3)]
    out, _ = run(params, logits, generator=gen, return_logprob=True)
    ref = torch.log_softmax(logits, -1)
    assert torch.allclose(out.logprobs, ref.gather(1, out.next_ids[:, None]).squeeze(1))
    assert out.top_logprobs is None


def test_top_logprobs_sorted_correct_and_per_row():
    logits = torch.randn(3, 40, generator=torch.Generator().manual_seed(6))
    out, _ = run([SP(temperature=0)] * 3, logits, top_logprobs_num=[0, 3, 5])
    ref = torch.log_softmax(logits, -1)
    assert out.top_logprobs[0] == ([], [])
    for row, k in ((1, 3), (2, 5)):
        ids, lps = out.top_logprobs[row]
        assert len(ids) == k and lps == sorted(lps, reverse=True)
        assert ids == ref[row].topk(k).indices.tolist()
        assert torch.allclose(torch.tensor(lps), ref[row, ids])
    out, _ = run([SP(temperature=0)] * 3, logits, top_logprobs_num=2)
    assert [len(ids) for ids, _ in out.top_logprobs] == [2, 2, 2]
    assert out.logprobs is not None


def test_mixed_batch_of_greedy_temperature_top_k_and_seeded_rows():
    gen = torch.Generator().manual_seed(8)
    logits = torch.randn(6, 400, generator=gen) * 2
    params = [SP(temperature=0), SP(temperature=0.7), SP(top_k=3), SP(seed=11, top_p=0.8),
              SP(top_k=1), SP(temperature=1e-3)]
    out, _ = run(params, logits, generator=gen, return_logprob=True)
    ids = out.next_ids.tolist()
    assert ids[0] == logits[0].argmax() and ids[4] == logits[4].argmax()
    assert ids[2] in logits[2].topk(3).indices.tolist()
    assert ids[5] == logits[5].argmax()  # T = 1e-3 is not greedy but as good as
    solo, _ = run([params[3]], logits[3:4])
    assert ids[3] == solo.next_ids.item()
    assert out.next_ids.dtype == torch.int64 and out.logprobs.dtype == torch.float32


def test_wide_top_p_support_widens_the_candidate_set():
    # A nearly flat distribution over 6000 tokens: top_p 0.9 needs ~5400 candidates.
    logits = torch.randn(1, 6000, generator=torch.Generator().manual_seed(9)) * 0.01
    probs = torch.softmax(logits, -1)
    allowed = reference_support(probs[0].tolist(), 6000, 0.9, 0.0)
    assert len(allowed) > 4096
    gen = torch.Generator().manual_seed(1)
    out, _ = run([SP(top_p=0.9)] * 200, logits.repeat(200, 1), generator=gen)
    assert set(out.next_ids.tolist()) <= allowed


def test_seeded_rows_follow_the_distribution_across_seeds():
    logits = torch.log(torch.tensor([0.5, 0.3, 0.2, 0.0]))
    rows = 2000
    out, _ = run([SP(seed=s) for s in range(rows)], logits.repeat(rows, 1))
    freq = torch.bincount(out.next_ids, minlength=4).double() / rows
    assert freq[3] == 0
    assert torch.allclose(freq[:3], torch.tensor([0.5, 0.3, 0.2], dtype=torch.float64), atol=0.04)
