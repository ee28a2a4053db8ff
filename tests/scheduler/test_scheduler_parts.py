"""Scheduling logic over a fake runner (tests/scheduler/fake_runner.py): admission, chunking,
retraction, preemption, aborts in every state, deadlines, overlap on and off, and the memory
invariant checked after every step and when idle. No torch: each test takes milliseconds.

The fake model reads every sequence back through its KV slots, so matching `reference()` also
proves the KV bookkeeping (prefix-cache hits, chunk boundaries, retraction, the future map)."""

from __future__ import annotations

import itertools
import random
import subprocess
import sys
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import pytest

from runtime.contracts.errors import InvalidRequest
from runtime.contracts.messages import AbortReq, FlushCacheReq, GetStateReq, ShutdownReq
from runtime.execution.forward_batch import ForwardEntry
from scheduler.grammar_queue import GrammarQueue
from scheduler.retract import INIT_RATIO
from scheduler.scheduler import Scheduler
from tests.scheduler.fake_runner import (
    VOCAB,
    FakeRunner,
    fake_logprob,
    make_fake,
    periodic_model,
    reference,
)
from tests.scheduler.io_helpers import FakeIO, collect, submit

ROOT = Path(__file__).resolve().parents[2]
SHARED = list(range(10, 34))  # a prefix several prompts share


def workload(seed: int = 0, n: int = 12) -> list[tuple[str, list[int], int]]:
    """(rid, prompt, max_new_tokens): half share a prefix of SHARED, lengths 1..40."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        own = [rng.randrange(3, VOCAB) for _ in range(rng.randrange(1, 40))]
        prompt = SHARED[: rng.randrange(0, len(SHARED))] + own if i % 2 else own
        out.append((f"r{i}", prompt, rng.randrange(1, 12)))
    return out


def drive(sched: Scheduler, io: FakeIO, max_steps: int = 5000) -> dict[str, dict[str, Any]]:
    """Step until idle, checking the busy invariant after every step; then one idle step, in
    which the loop checks the idle invariant itself."""
    for _ in range(max_steps):
        sched.step()
        sched.check_integrity()
        if sched.is_idle and not io.inbox and sched.in_flight is None:
            break
    else:
        raise AssertionError("scheduler did not go idle")
    sched.step()
    assert sched.parts.checked_idle and sched.ratio.value == INIT_RATIO
    sched.check_idle_integrity()
    return collect(io)


def run_workload(sched: Scheduler, io: FakeIO, work: list[tuple[str, list[int], int]]) -> dict[str, Any]:
    for rid, prompt, new in work:
        submit(io, rid, prompt, max_new_tokens=new)
    return drive(sched, io)


def assert_reference(results: dict[str, Any], work: list[tuple[str, list[int], int]], **kw: Any) -> None:
    for rid, prompt, new in work:
        r = results[rid]
        assert r["ids"] == reference(prompt, new, **kw), rid
        assert r["finishes"] == 1 and r["finish"] == {"type": "length", "length": new}, rid


GRID = list(itertools.product([False, True], [False, True], [8, -1], [1, 4], [False, True]))


@pytest.mark.parametrize("overlap,radix,chunk,page,mixed", GRID,
                         ids=[f"ov{o:d}-rx{r:d}-ch{c}-pg{p}-mx{m:d}" for o, r, c, p, m in GRID])
def test_outputs_match_the_reference_in_every_configuration(overlap: bool, radix: bool, chunk: int, page: int,
                                                            mixed: bool) -> None:
    sched, io, runner = make_fake(disable_overlap_schedule=not overlap, disable_radix_cache=not radix,
                                  chunked_prefill_size=chunk, page_size=page, enable_mixed_chunk=mixed)
    work = workload()
    assert_reference(run_workload(sched, io, work), work)
    if overlap:  # some decode read its input from the future map: the loop really overlapped
        assert any(e.input_from_future for batch in runner.log for e in batch)


@pytest.mark.parametrize("policy", ["fcfs", "lpm", "dfs-weight"])
def test_every_policy_serves_everyone_with_reference_outputs(policy: str) -> None:
    sched, io, _ = make_fake(tokens=256, rows=4, schedule_policy=policy, chunked_prefill_size=16)
    work = workload(seed=1, n=20)
    assert_reference(run_workload(sched, io, work), work)


def test_a_repeated_prompt_hits_the_cache() -> None:
    sched, io, _ = make_fake()
    prompt = SHARED + [5, 6, 7]
    first = run_workload(sched, io, [("a", prompt, 4)])["a"]
    second = run_workload(sched, io, [("b", prompt, 4)])["b"]
    assert first["cached"] == 0 and second["cached"] == len(prompt) - 1
    assert first["ids"] == second["ids"] == reference(prompt, 4)


def test_a_long_prompt_is_prefilled_in_chunks() -> None:
    sched, io, runner = make_fake(chunked_prefill_size=8)
    prompt = list(range(40, 70))
    submit(io, "long", prompt, max_new_tokens=3)
    sched.step()
    assert sched.queues.chunked is not None and sched.queues.chunked.rid == "long"
    results = drive(sched, io)
    prefills = [len(e.input_ids) for batch in runner.log for e in batch if not e.input_from_future][:4]
    assert prefills == [8, 8, 8, 6]
    assert results["long"]["ids"] == reference(prompt, 3)


def test_mixed_batches_decode_beside_a_chunked_prompt() -> None:
    sched, io, _ = make_fake(chunked_prefill_size=8, enable_mixed_chunk=True)
    submit(io, "short", [5, 6, 7], max_new_tokens=20)
    sched.step()
    submit(io, "long", list(range(40, 90)), max_new_tokens=2)
    results = drive(sched, io)
    assert sched.batcher.mixed_steps > 0
    assert results["short"]["ids"] == reference([5, 6, 7], 20)
    assert results["long"]["ids"] == reference(list(range(40, 90)), 2)


def test_admission_keeps_to_max_running_requests() -> None:
    sched, io, _ = make_fake(rows=4, max_running_requests=2)
    work = workload(n=6)
    for rid, prompt, new in work:
        submit(io, rid, prompt, max_new_tokens=new)
    for _ in range(500):
        sched.step()
        assert sched.queues.num_running() <= 2 and len(sched.ledger.holding) <= 2
        if sched.is_idle:
            break
    assert_reference(collect(io), work)


@pytest.mark.parametrize("overlap", [False, True])
@pytest.mark.parametrize("page", [1, 4])
def test_a_tight_pool_retracts_and_outputs_stay_identical(overlap: bool, page: int) -> None:
    sched, io, _ = make_fake(tokens=96, chunked_prefill_size=16, page_size=page,
                             disable_overlap_schedule=not overlap)
    sched.ratio.value = 0.0  # reserve nothing for decode growth: the pool must retract
    work = [(f"t{i}", [20 + i] * (6 + i), 30) for i in range(6)]
    assert_reference(run_workload(sched, io, work), work)
    assert sched.retractor.retractions > 0


def test_requests_that_can_never_run_are_rejected_and_serving_goes_on() -> None:
    sched, io, _ = make_fake(tokens=32, context_length=50)
    submit(io, "huge", list(range(3, 40)), max_new_tokens=4)  # fits the context, not the pool
    submit(io, "overlong", list(range(3, 60)), max_new_tokens=1)  # longer than the context
    submit(io, "empty", [], max_new_tokens=1)
    submit(io, "ok", [4, 5, 6], max_new_tokens=4)
    results = drive(sched, io)
    assert "KV" in results["huge"]["finish"]["message"]
    assert "context" in results["overlong"]["finish"]["message"]
    assert results["empty"]["finish"]["type"] == "abort"
    assert results["ok"]["ids"] == reference([4, 5, 6], 4)


def test_a_request_past_the_context_is_refused_not_rewritten() -> None:
    """The main process decides context fit; the scheduler never lowers max_new_tokens."""
    sched, io, _ = make_fake(context_length=20)
    submit(io, "a", list(range(3, 13)), max_new_tokens=100)
    submit(io, "b", list(range(3, 13)), max_new_tokens=10)
    results = drive(sched, io)
    assert results["a"]["finish"]["type"] == "abort" and "context" in results["a"]["finish"]["message"]
    assert results["b"]["finish"] == {"type": "length", "length": 10}


class PendingGrammars:
    """A grammar backend whose compiles never finish unless failed by hand."""

    def __init__(self) -> None:
        self.futures: list[Future[Any]] = []

    def submit(self, spec: Any) -> Future[Any]:
        self.futures.append(Future())
        return self.futures[-1]

    def new_state(self, compiled: Any) -> Any:
        raise AssertionError("no compile completes in these tests")

    def forget(self, spec: Any) -> None:
        pass

    def reset(self) -> None:
        pass


def where(sched: Scheduler, rid: str) -> str:
    q = sched.queues
    places = {"grammar": q.grammars.pending, "waiting": q.waiting, "running": q.running,
              "chunked": [] if q.chunked is None else [q.chunked]}
    found = [name for name, reqs in places.items() if any(r.rid == rid for r in reqs)]
    return found[0] if found else "nowhere"


@pytest.mark.parametrize("overlap", [False, True])
def test_abort_in_every_state_ends_each_request_once(overlap: bool) -> None:
    backend = PendingGrammars()
    sched, io, _ = make_fake(rows=3, chunked_prefill_size=8, disable_overlap_schedule=not overlap,
                             grammars=GrammarQueue(lambda: backend))  # type: ignore[arg-type, return-value]
    submit(io, "done", [8, 9], max_new_tokens=1)  # ends at once, before the aborts arrive
    submit(io, "run", [5] * 4, max_new_tokens=200)
    submit(io, "chunk", list(range(3, 60)), max_new_tokens=200)  # admitting stops while it is mid-chunk
    submit(io, "wait", [7] * 5, max_new_tokens=200)
    submit(io, "gram", [6] * 5, max_new_tokens=200, regex="[0-9]+")
    for _ in range(4):
        sched.step()
    states = {rid: where(sched, rid) for rid in ("run", "chunk", "wait", "gram")}
    assert states == {"run": "running", "chunk": "chunked", "wait": "waiting", "gram": "grammar"}
    assert collect(io)["done"]["finish"]["type"] == "length"
    io.inbox += [AbortReq(rid) for rid in ("run", "chunk", "wait", "gram", "done")]
    results = drive(sched, io)
    for rid in ("run", "chunk", "wait", "gram"):
        assert results[rid]["finish"]["type"] == "abort" and results[rid]["finishes"] == 1, rid
    assert "done" not in results  # reported finished before the aborts: they were no-ops for it


def test_abort_of_a_prefill_in_flight_under_overlap() -> None:
    sched, io, _ = make_fake(disable_overlap_schedule=False)
    submit(io, "inflight", [5, 6, 7, 8], max_new_tokens=50)
    sched.step()
    assert sched.in_flight is not None and sched.in_flight.is_prefill
    assert where(sched, "inflight") == "nowhere" and sched.ledger.holding  # in no queue, holding a row
    io.inbox.append(AbortReq("inflight"))
    sched.step()
    assert sched.in_flight is None
    results = drive(sched, io)
    assert results["inflight"]["finish"]["type"] == "abort" and results["inflight"]["finishes"] == 1


def test_abort_by_parent_rid_and_abort_all() -> None:
    sched, io, _ = make_fake()
    for rid in ("p_0", "p_1", "p10", "q"):
        submit(io, rid, [9, 8, 7], max_new_tokens=100)
    sched.step()
    io.inbox.append(AbortReq("p"))
    sched.step()
    assert {rid for rid, r in collect(io).items() if r["finish"]} == {"p_0", "p_1"}
    io.inbox.append(AbortReq(abort_all=True))
    results = drive(sched, io)
    assert results["p10"]["finish"]["type"] == results["q"]["finish"]["type"] == "abort"


@pytest.mark.parametrize("overlap", [False, True])
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_abort_fuzz(overlap: bool, seed: int) -> None:
    """Random arrivals and aborts (by rid, by parent, all) in a small pool: every request ends
    once, as an abort exactly when an abort reached it first, else with its reference tokens."""
    rng = random.Random(seed)
    sched, io, _ = make_fake(tokens=200, rows=6, chunked_prefill_size=8, disable_overlap_schedule=not overlap)
    prompts: dict[str, tuple[list[int], int]] = {}
    ended: set[str] = set()
    aborted: set[str] = set()
    results: dict[str, dict[str, Any]] = {}
    for step in range(400):
        if step < 250 and rng.random() < 0.4:
            rid = f"q{len(prompts)}" + ("_0" if rng.random() < 0.2 else "")
            prompts[rid] = ([rng.randrange(3, VOCAB) for _ in range(rng.randrange(1, 50))], rng.randrange(0, 25))
            submit(io, rid, prompts[rid][0], max_new_tokens=prompts[rid][1])
        roll = rng.random()
        if prompts and roll < 0.1:
            target = rng.choice(list(prompts)).split("_")[0]
            io.inbox.append(AbortReq(target))
            aborted.update(r for r in prompts if r.split("_")[0] == target and r not in ended)
        elif roll < 0.11:
            io.inbox.append(AbortReq(abort_all=True))
            aborted.update(r for r in prompts if r not in ended)
        sched.step()
        sched.check_integrity()
        for rid, r in collect(io).items():
            merged = results.setdefault(rid, {"ids": [], "finishes": 0, "finish": None})
            merged["ids"] += r["ids"]
            merged["finishes"] += r["finishes"]
            merged["finish"] = r["finish"] or merged["finish"]
            if r["finish"]:
                ended.add(rid)
    for rid, r in drive(sched, io).items():
        results[rid]["ids"] += r["ids"]
        results[rid]["finishes"] += r["finishes"]
        results[rid]["finish"] = r["finish"] or results[rid]["finish"]
    assert set(results) == set(prompts) and aborted
    for rid, (prompt, new) in prompts.items():
        r = results[rid]
        assert r["finishes"] == 1, (rid, r)
        if rid in aborted:
            assert r["finish"]["type"] == "abort", (rid, r)
        else:
            assert r["finish"]["type"] == "length" and r["ids"] == reference(prompt, new), (rid, r)


def test_overlap_on_and_off_send_the_same_stream() -> None:
    outs = []
    for overlap in (False, True):
        sched, io, _ = make_fake(tokens=128, chunked_prefill_size=8, disable_overlap_schedule=not overlap)
        sched.ratio.value = 0.0
        results = run_workload(sched, io, workload(seed=4))
        outs.append({rid: (r["ids"], r["finish"], r["finishes"]) for rid, r in results.items()})
    assert outs[0] == outs[1]


@pytest.mark.parametrize("overlap", [False, True])
def test_the_event_loop_stops_at_shutdown_with_nothing_in_flight(overlap: bool) -> None:
    sched, io, runner = make_fake(disable_overlap_schedule=not overlap)
    submit(io, "a", [4, 5, 6], max_new_tokens=50)
    for _ in range(3):
        sched.step()
    io.inbox.append(ShutdownReq())
    sched.event_loop()
    assert sched.inbox.stopped and sched.in_flight is None
    # The plain loop ends the iteration that received it; the overlap loop launches nothing more.
    assert len(runner.log) == (3 if overlap else 4)


def test_the_idle_check_catches_a_leak() -> None:
    sched, io, _ = make_fake()
    run_workload(sched, io, [("a", [4, 5, 6], 3)])
    assert sched.ledger.cache.allocator.alloc(1) is not None  # a slot taken behind the cache's back
    submit(io, "b", [4, 5, 7], max_new_tokens=2)
    with pytest.raises(AssertionError):
        for _ in range(50):
            sched.step()


@pytest.mark.parametrize("overlap", [False, True])
def test_overdue_requests_end_with_abort_in_every_state(overlap: bool) -> None:
    backend = PendingGrammars()
    sched, io, _ = make_fake(rows=1, chunked_prefill_size=8, disable_overlap_schedule=not overlap,
                             grammars=GrammarQueue(lambda: backend))  # type: ignore[arg-type, return-value]
    now = [1000.0]
    sched.lifecycle.clock = lambda: now[0]
    submit(io, "run", [5] * 10, max_new_tokens=400, deadline=1010.0)
    submit(io, "wait", [7] * 5, max_new_tokens=400, deadline=1010.0)
    submit(io, "gram", [6] * 5, max_new_tokens=400, deadline=1010.0, regex="[0-9]+")
    submit(io, "past", [6] * 5, max_new_tokens=3, deadline=999.0)  # expired on arrival
    submit(io, "late", [7] * 5, max_new_tokens=3, deadline=5000.0)
    for _ in range(4):
        sched.step()
    now[0] = 1010.0
    results = drive(sched, io)
    for rid in ("run", "wait", "gram", "past"):
        finish = results[rid]["finish"]
        assert finish["type"] == "abort" and "deadline" in finish["message"] and results[rid]["finishes"] == 1
    assert results["late"]["ids"] == reference([7] * 5, 3)
    assert sched.state()["deadline_expired"] == 4


def test_a_failed_grammar_compile_is_a_400_naming_its_field() -> None:
    backend = PendingGrammars()
    sched, io, _ = make_fake(grammars=GrammarQueue(lambda: backend))  # type: ignore[arg-type, return-value]
    submit(io, "bad", [5, 6], max_new_tokens=3, regex="(")
    sched.step()
    backend.futures[0].set_exception(InvalidRequest("unbalanced", param="regex"))
    finish = drive(sched, io)["bad"]["finish"]
    assert finish["type"] == "abort" and finish["param"] == "regex" and "unbalanced" in finish["message"]


def test_flush_is_refused_while_busy_and_state_polls_use_counters() -> None:
    sched, io, _ = make_fake(disable_overlap_schedule=False)
    submit(io, "a", [5, 6, 7, 8], max_new_tokens=3)
    sched.step()
    io.inbox += [FlushCacheReq(1), GetStateReq(2)]
    sched.step()
    refused, busy = io.control  # the prefill is in flight: "a" is in no queue, but holds memory
    assert not refused.success and busy.state["integrity"] == "ok" and busy.state["rows_free"] == 15
    drive(sched, io)
    io.inbox += [GetStateReq(3), FlushCacheReq(4), GetStateReq(5)]
    sched.step()
    before, flushed, after = io.control[2:]
    assert before.state["kv_evictable"] > 0 and flushed.success and after.state["kv_evictable"] == 0


def test_prefill_only_returns_input_logprobs_across_chunks() -> None:
    sched, io, _ = make_fake(chunked_prefill_size=8)
    prompt = list(range(30, 51))
    submit(io, "score", prompt, max_new_tokens=0, return_logprob=True, logprob_start_len=0)
    r = drive(sched, io)["score"]
    assert r["ids"] == [] and r["finish"] == {"type": "length", "length": 0}
    assert r["input_logprobs"] == [None] + [fake_logprob(t) for t in prompt[1:]]


def test_output_logprobs_and_stop_tokens() -> None:
    sched, io, _ = make_fake()
    prompt = [11, 12, 13]
    expected = reference(prompt, 8)
    stop = expected[2]
    submit(io, "s", prompt, max_new_tokens=8, stop_token_ids=[stop], return_logprob=True, top_logprobs_num=1)
    for _ in range(20):
        sched.step()
    logprobs = [lp for out in io.outs for lp in out.output_logprobs[0] or []]
    tops = [top for out in io.outs for top in out.output_top_logprobs[0] or []]
    r = collect(io)["s"]
    kept = expected[: expected.index(stop) + 1]
    assert r["ids"] == kept and r["finish"] == {"type": "stop", "matched": stop}
    assert logprobs == [fake_logprob(t) for t in kept] and [t[0] for t in tops] == [[t] for t in kept]


def test_an_urgent_arrival_preempts_and_the_victim_resumes_unchanged() -> None:
    sched, io, _ = make_fake(rows=1, enable_priority_scheduling=True, priority_aging_timeout=0.0)
    submit(io, "background", [20, 21, 22], max_new_tokens=30, priority=0)
    for _ in range(5):
        sched.step()
    submit(io, "urgent", [9, 9, 9], max_new_tokens=4, priority=50)
    results = drive(sched, io)
    assert sched.retractor.preemptions == 1 and sched.retractor.retractions == 1
    assert results["background"]["ids"] == reference([20, 21, 22], 30)
    assert results["urgent"]["ids"] == reference([9, 9, 9], 4)


def test_ngram_drafts_are_verified_and_keep_the_reference_tokens() -> None:
    model = periodic_model(12)
    sched, io, _ = make_fake(model=model, speculative_algorithm="ngram", speculative_disable_by_batch_size=64,
                             page_size=4)
    work = [(f"s{i}", [30 + i, 40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50 + i] * 2, 20) for i in range(3)]
    assert_reference(run_workload(sched, io, work), work, model=model)
    assert sched.speculator is not None and sched.speculator.accepted > 0


def test_scheduling_needs_no_torch() -> None:
    """Every scheduler module but the process entry and the KV tier (which copies K/V) imports
    without torch, and a whole workload runs on the fake runner without loading it."""
    script = (
        "import pkgutil, importlib, sys, scheduler\n"
        "for m in pkgutil.iter_modules(scheduler.__path__):\n"
        "    if m.name not in ('process', 'kv_tier'):\n"
        "        importlib.import_module('scheduler.' + m.name)\n"
        "from tests.scheduler.fake_runner import make_fake\n"
        "from tests.scheduler.io_helpers import submit\n"
        "sched, io, _ = make_fake(disable_overlap_schedule=False)\n"
        "submit(io, 'a', [5, 6, 7], max_new_tokens=5)\n"
        "for _ in range(10):\n"
        "    sched.step()\n"
        "assert sched.is_idle and sched.in_flight is None and len(io.outs) >= 2\n"
        "sys.exit('torch was imported' if 'torch' in sys.modules else 0)\n"
    )
    run = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-3000:]


def test_the_fake_runner_catches_a_wrong_slot() -> None:
    """The oracle itself: a KV slot pointing at another request's token changes the output."""
    runner = FakeRunner(num_slots=64, rows=2)
    runner.forward([ForwardEntry(row=0, input_ids=[5, 6, 7], prefix_len=0, kv_write=[1, 2, 3], kv_write_start=0)])
    good = runner.forward([ForwardEntry(row=1, input_ids=[5, 6, 7], prefix_len=0, kv_write=[4, 5, 6],
                                        kv_write_start=0)]).next_ids
    bad = runner.forward([ForwardEntry(row=1, input_ids=[7], prefix_len=2, kv_write=[3, 2, 9],
                                       kv_write_start=0)]).next_ids  # positions 0, 1 read 7 and 6
    assert good == reference([5, 6, 7], 1) and bad != good
