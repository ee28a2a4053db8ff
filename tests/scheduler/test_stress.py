"""Stress and fuzz tests of the scheduler on a tiny model, in-process (no sockets).

- A random prefix tree of ~100 prompts sent at once into a small pool with chunked prefill, under
  every policy (modelled on SGLang's test_radix_attention): everything completes, memory sound.
- Random aborts (by rid, by prefix, abort_all) at random moments, overlap on and off: every
  request finishes exactly once and nothing leaks.
"""

from __future__ import annotations

import random

import pytest

from runtime.contracts.messages import AbortReq
from runtime.contracts.sampling import SamplingParams
from scheduler.policy import order_waiting
from scheduler.request import Req
from tests.scheduler.harness import VOCAB, make, run_until_idle, submit


def random_prefix_tree(rng: random.Random, nodes: int) -> list[tuple[list[int], int]]:
    """(prompt, max_new_tokens) per node of a random tree: a child extends its parent's prompt."""
    prompts: list[list[int]] = [[rng.randrange(3, VOCAB) for _ in range(40)]]
    while len(prompts) < nodes:
        parent = rng.choice(prompts)
        prompts.append(parent + [rng.randrange(3, VOCAB) for _ in range(rng.randrange(0, 24))])
    return [(p, rng.randrange(0, 12)) for p in prompts]


@pytest.mark.parametrize("policy", ["fcfs", "lpm", "dfs-weight"])
@pytest.mark.parametrize("overlap", [False, True])
def test_random_prefix_tree_completes(tiny_model: str, policy: str, overlap: bool) -> None:
    tree = random_prefix_tree(random.Random(7), 100)
    sched, io = make(tiny_model, max_total_tokens=600, chunked_prefill_size=32, schedule_policy=policy,
                     max_running_requests=16, disable_overlap_schedule=not overlap)
    for i, (prompt, new) in enumerate(tree):
        submit(io, f"n{i}", prompt, max_new_tokens=new)
    results = run_until_idle(sched, io, max_steps=20000)
    assert len(results) == len(tree)
    for i, (_, new) in enumerate(tree):
        r = results[f"n{i}"]
        assert r["finishes"] == 1 and r["finish"] == {"type": "length", "length": new}, (i, r["finish"])
        assert len(r["ids"]) == new


def _reported_finished(io, seen: int, finished: set[str]) -> int:
    """Add the rids whose finish the scheduler has reported in io.outs[seen:]; new `seen`."""
    for out in io.outs[seen:]:
        finished.update(rid for rid, reason in zip(out.rids, out.finished_reasons) if reason is not None)
    return len(io.outs)


@pytest.mark.parametrize("overlap", [False, True])
@pytest.mark.parametrize("seed", [1, 2])
def test_abort_fuzz(tiny_model: str, overlap: bool, seed: int) -> None:
    """Random submissions and aborts (by rid, by parent rid prefix, abort_all) in every state.
    Every request finishes once; one aborted before its finish was reported ends as an abort;
    the memory invariant holds throughout and once idle."""
    rng = random.Random(seed)
    sched, io = make(tiny_model, max_total_tokens=500, chunked_prefill_size=16, max_running_requests=8,
                     disable_overlap_schedule=not overlap)
    rids: list[str] = []
    finished: set[str] = set()
    aborted_live: set[str] = set()  # rids an abort reached before their finish was reported
    seen = 0
    for step in range(600):
        if step < 300 and rng.random() < 0.3:
            rid = f"q{len(rids)}" + ("_0" if rng.random() < 0.2 else "")
            rids.append(rid)
            submit(io, rid, [rng.randrange(3, VOCAB) for _ in range(rng.randrange(1, 60))],
                   max_new_tokens=rng.randrange(0, 30))
        seen = _reported_finished(io, seen, finished)
        roll = rng.random()
        if rids and roll < 0.15:
            target = rng.choice(rids).split("_")[0]
            io.inbox.append(AbortReq(target))
            aborted_live.update(r for r in rids if r.split("_")[0] == target and r not in finished)
        elif roll < 0.16:
            io.inbox.append(AbortReq(abort_all=True))
            aborted_live.update(r for r in rids if r not in finished)
        sched.step()
        if step % 25 == 0:
            sched.check_integrity()
    results = run_until_idle(sched, io)
    assert set(results) == set(rids)
    assert aborted_live, "the fuzz never aborted a live request"
    for rid in rids:
        r = results[rid]
        assert r["finishes"] == 1, (rid, r)
        assert r["finish"]["type"] == ("abort" if rid in aborted_live else "length"), (rid, r)


def _req(rid: str, tokens: list[int]) -> Req:
    return Req(rid=rid, prompt=tokens, sampling=SamplingParams())


def test_dfs_weight_groups_shared_prefixes_and_defers_duplicates(tiny_model: str) -> None:
    sched, io = make(tiny_model, schedule_policy="dfs-weight")
    shared = list(range(10, 60))
    submit(io, "warm", shared + [7], max_new_tokens=1)
    run_until_idle(sched, io)  # the cache now holds `shared`
    cold_a, cold_b = [5] * 40 + [1], [5] * 40 + [2]  # share 40 uncached tokens with each other
    queue = [_req("cold_a", cold_a), _req("hot_1", shared + [1]), _req("cold_b", cold_b), _req("hot_2", shared + [2])]
    order = [r.rid for r in order_waiting(queue, "dfs-weight", sched.ledger.cache)]
    assert order[:2] == ["hot_1", "hot_2"]  # the heavier cached subtree first, together
    assert "cold_a" in order and "cold_b" not in order  # deferred one round behind cold_a
    lpm = [r.rid for r in order_waiting(queue, "lpm", sched.ledger.cache)]
    assert lpm[:2] == ["hot_1", "hot_2"] and "cold_b" not in lpm
    assert [r.rid for r in order_waiting(queue, "fcfs", sched.ledger.cache)] == ["cold_a", "hot_1", "cold_b", "hot_2"]
