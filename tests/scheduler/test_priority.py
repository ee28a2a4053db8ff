"""Priority scheduling on the tiny model, driven step by step: urgency orders the queue, an urgent
arrival preempts less urgent running requests (which resume with the same greedy tokens),
preemption needs an urgency difference above the threshold,
the per-request preemption cap holds, aging lets a starved request through,
and under saturation by low-priority work the urgent requests' first token comes in the step
they arrive while every low-priority request still completes."""

from __future__ import annotations

import pytest

from runtime.execution.static_batch import StaticBatch
from scheduler.priority import MAX_PREEMPTIONS
from tests.scheduler.harness import FakeIO, collect, make, submit

PRIORITY = dict(enable_priority_scheduling=True, priority_aging_timeout=0.0)


def step_until_idle(sched, io: FakeIO, arrivals: dict[int, list[tuple]] | None = None,
                    max_steps: int = 2000) -> tuple[dict[str, dict], dict[str, int], dict[str, int]]:
    """Step the scheduler (no overlap); `arrivals[k]` are submit() argument tuples sent before
    step k. Returns (results, the step each rid arrived at, the step of its first token)."""
    arrivals = arrivals or {}
    arrived: dict[str, int] = {}
    first: dict[str, int] = {}
    results: dict[str, dict] = {}
    for k in range(max_steps):
        for rid, prompt, params in arrivals.get(k, []):
            submit(io, rid, prompt, **params)
            arrived[rid] = k
        sched.step()
        for out in io.outs:
            for i, rid in enumerate(out.rids):
                if out.new_ids[i] and rid not in first:
                    first[rid] = k
        for rid, r in collect(io).items():
            merged = results.setdefault(rid, {"ids": [], "finishes": 0})
            merged["ids"] += r["ids"]
            merged["finishes"] += r["finishes"]
        if sched.is_idle and not io.inbox and k >= max(arrivals, default=0):
            break
    sched.check_idle_integrity()
    return results, arrived, first


def test_the_queue_goes_by_priority_then_arrival(tiny_model: str) -> None:
    sched, io = make(tiny_model, max_running_requests=1, **PRIORITY)
    for rid, priority in [("low-1", 0), ("low-2", 0), ("high", 5), ("mid", 3)]:
        submit(io, rid, [7, 8, 9], max_new_tokens=3, priority=priority)
    _, _, first = step_until_idle(sched, io)
    assert sorted(first, key=first.get) == ["high", "mid", "low-1", "low-2"]


def test_low_values_first_flips_the_order(tiny_model: str) -> None:
    sched, io = make(tiny_model, max_running_requests=1, schedule_low_priority_values_first=True, **PRIORITY)
    for rid, priority in [("a", 5), ("b", -1), ("c", 0)]:
        submit(io, rid, [7, 8, 9], max_new_tokens=3, priority=priority)
    _, _, first = step_until_idle(sched, io)
    assert sorted(first, key=first.get) == ["b", "c", "a"]


@pytest.mark.parametrize("overlap", [False, True])
def test_an_urgent_arrival_preempts_and_the_victim_resumes_unchanged(tiny_model: str, overlap: bool) -> None:
    prompt = [20, 21, 22, 23, 24]
    expected = StaticBatch.create(tiny_model, dtype="float32", max_total_tokens=1024).generate_greedy([prompt], 30)[0]
    sched, io = make(tiny_model, max_running_requests=1, disable_overlap_schedule=not overlap, **PRIORITY)
    submit(io, "background", prompt, max_new_tokens=30, priority=0)
    urgent = ("urgent", [9, 9, 9], {"max_new_tokens": 4, "priority": 50})
    if overlap:
        for _ in range(6):  # prefill, then decodes overlapped with the next step
            sched.step()
        submit(io, urgent[0], urgent[1], **urgent[2])
        for _ in range(200):
            sched.step()
            if sched.is_idle and sched.in_flight is None:
                break
        sched.check_idle_integrity()
        results = collect(io)
    else:
        results, arrived, first = step_until_idle(sched, io, {5: [urgent]})
        assert first["urgent"] == arrived["urgent"]  # admitted in the step it arrived
    assert sched.retractor.preemptions == 1 and sched.retractor.retractions == 1
    assert results["background"]["ids"] == expected and results["background"]["finishes"] == 1
    assert len(results["urgent"]["ids"]) == 4


@pytest.mark.parametrize("low_values_first, priority, preempts", [
    (False, 10, False), (False, 11, True),  # urgency difference == threshold: no; threshold + 1: yes
    (True, -10, False), (True, -11, True),  # the same with the sign flipped
])
def test_preemption_needs_a_difference_above_the_threshold(tiny_model: str, low_values_first: bool, priority: int,
                                                           preempts: bool) -> None:
    sched, io = make(tiny_model, max_running_requests=1, priority_scheduling_preemption_threshold=10,
                     schedule_low_priority_values_first=low_values_first, **PRIORITY)
    submit(io, "background", [5, 6, 7], max_new_tokens=30, priority=0)
    arrival = {3: [("arrival", [8, 8], {"max_new_tokens": 2, "priority": priority})]}
    results, arrived, first = step_until_idle(sched, io, arrival)
    assert all(r["finishes"] == 1 for r in results.values())
    delay = first["arrival"] - arrived["arrival"]
    if preempts:
        assert (sched.retractor.preemptions, sched.retractor.retractions, delay) == (1, 1, 0)
    else:  # the one row stays with "background" until its 30 tokens are out
        assert (sched.retractor.preemptions, sched.retractor.retractions) == (0, 0) and delay >= 30 - 3 - 1, delay


def test_the_cap_limits_preemptions_per_request(tiny_model: str) -> None:
    sched, io = make(tiny_model, max_running_requests=1, priority_scheduling_preemption_threshold=10, **PRIORITY)
    submit(io, "background", [5, 6, 7], max_new_tokens=40, priority=0)
    arrivals = {6 + 4 * i: [(f"urgent-{i}", [9, 9], {"max_new_tokens": 2, "priority": 50})]
                for i in range(MAX_PREEMPTIONS + 2)}
    results, arrived, first = step_until_idle(sched, io, arrivals)
    assert sched.retractor.preemptions == MAX_PREEMPTIONS  # then "background" keeps its row
    delays = [first[f"urgent-{i}"] - arrived[f"urgent-{i}"] for i in range(MAX_PREEMPTIONS + 2)]
    assert delays[:MAX_PREEMPTIONS] == [0] * MAX_PREEMPTIONS
    assert min(delays[MAX_PREEMPTIONS:]) >= 10, delays  # they wait for "background" to finish
    assert all(r["finishes"] == 1 for r in results.values())


def test_aging_lets_a_starved_request_through(tiny_model: str) -> None:
    """A stream of urgent requests keeps the one row busy; the low one waits until it has aged."""
    sched, io = make(tiny_model, max_running_requests=1, enable_priority_scheduling=True,
                     priority_aging_timeout=3600.0)
    submit(io, "starved", [5, 6], max_new_tokens=2, priority=0)
    stream = {k: [(f"u{k}", [9, 9], {"max_new_tokens": 2, "priority": 9})] for k in range(0, 40, 2)}

    def age_at_step_20() -> None:
        for req in sched.queues.waiting:
            if req.rid == "starved":
                req.arrival -= 3600.0  # as if it had waited the whole timeout

    original_step = sched.step
    calls = {"n": 0}

    def step() -> object:
        calls["n"] += 1
        if calls["n"] == 20:
            age_at_step_20()
        return original_step()

    sched.step = step  # type: ignore[method-assign]
    results, arrived, first = step_until_idle(sched, io, stream)
    assert 19 <= first["starved"] <= 22  # after it aged, before the urgent ones still arriving
    assert any(first[f"u{k}"] > first["starved"] for k in range(24, 40, 2))
    assert all(r["finishes"] == 1 for r in results.values())


def test_urgent_first_tokens_stay_prompt_under_saturation(tiny_model: str) -> None:
    """8 rows saturated by 24 long low-priority requests; 10 urgent short ones arrive over time.

    Bound: each urgent request's first token comes in the step it arrives (measured: 0 steps
    for all 10), while the low-priority ones still all complete and the pool ends sound."""
    sched, io = make(tiny_model, max_running_requests=8, max_total_tokens=2048, chunked_prefill_size=64,
                     **PRIORITY)
    arrivals: dict[int, list[tuple]] = {0: [(f"low-{i}", [30 + i] * 20, {"max_new_tokens": 60, "priority": 0})
                                            for i in range(24)]}
    for j in range(10):
        arrivals[8 + 7 * j] = [(f"high-{j}", [90 + j] * 6, {"max_new_tokens": 5, "priority": 100})]
    results, arrived, first = step_until_idle(sched, io, arrivals)
    delays = [first[f"high-{j}"] - arrived[f"high-{j}"] for j in range(10)]
    assert max(delays) == 0, delays
    assert all(results[f"low-{i}"]["finishes"] == 1 and len(results[f"low-{i}"]["ids"]) == 60 for i in range(24))
    assert sched.retractor.preemptions >= 1
