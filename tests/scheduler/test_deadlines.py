"""Request deadlines: the heap (pure), and the scheduler aborting overdue requests in every state
(waiting, running, mid-chunk, in the grammar queue), freeing what they hold."""

from __future__ import annotations

import gc
from dataclasses import dataclass

import pytest

from scheduler.deadlines import MIN_COMPACT, Deadlines
from tests.scheduler.harness import collect, make, run_until_idle, submit


@dataclass(eq=False)
class R:
    rid: str
    deadline: float | None


def reachable(root: object) -> list[object]:
    """Every object reachable from `root` through references (gc's view), `root` excluded."""
    seen, stack, out = {id(root)}, [root], []
    while stack:
        for ref in gc.get_referents(stack.pop()):
            if id(ref) not in seen and not isinstance(ref, type):
                seen.add(id(ref))
                out.append(ref)
                stack.append(ref)
    return out


def test_heap_pops_due_requests_in_deadline_order() -> None:
    d = Deadlines()
    a, b, c, done, none = R("a", 3.0), R("b", 1.0), R("c", 9.0), R("done", 0.5), R("x", None)
    for r in (a, b, c, done, none):
        d.add(r)
    assert len(d) == 4  # no deadline: not tracked
    assert d.pop_expired(0.1) == []
    d.remove("done")  # it finished: gone at once, its heap entry skipped
    d.remove("never-added")
    assert d.pop_expired(3.0) == ["b", "a"]
    assert len(d) == 1
    d.check_integrity()
    d.clear()
    assert d.pop_expired(100.0) == []


def test_a_re_added_rid_keeps_only_its_new_deadline() -> None:
    d = Deadlines()
    d.add(R("a", 1.0))
    d.remove("a")
    d.add(R("a", 5.0))
    assert d.pop_expired(2.0) == []  # the old entry is stale
    assert d.pop_expired(5.0) == ["a"]


def test_finished_requests_leave_at_once_and_the_heap_stays_compact() -> None:
    """Steady load: every request has a far deadline and finishes long before it; the heap
    never grows past a constant times the live requests, and holds no request."""
    d = Deadlines()
    live: list[R] = []
    for i in range(20_000):
        req = R(f"r{i}", 1e9 + i)
        d.add(req)
        live.append(req)
        if len(live) > 10:
            d.remove(live.pop(0).rid)
        assert len(d) == len(live) and d.heap_size <= max(2 * len(live), MIN_COMPACT)
    assert d.pop_expired(0.0) == []
    d.check_integrity()
    assert not any(isinstance(x, R) for x in reachable(d))


@pytest.mark.parametrize("overlap", [False, True], ids=["plain", "overlap"])
def test_overdue_requests_end_with_abort_in_every_state(tiny_model: str, overlap: bool) -> None:
    sched, io = make(tiny_model, chunked_prefill_size=8, max_running_requests=1,
                     disable_overlap_schedule=not overlap)
    now = [1000.0]
    sched.lifecycle.clock = lambda: now[0]
    submit(io, "run", [5] * 10, max_new_tokens=400, deadline=1010.0)
    submit(io, "chunk", list(range(3, 60)), max_new_tokens=400, deadline=1010.0)  # waits, then chunks
    submit(io, "wait", [7] * 5, max_new_tokens=400, deadline=1010.0)
    submit(io, "late", [7] * 5, max_new_tokens=3, deadline=5000.0)  # finishes normally
    submit(io, "past", [6] * 5, max_new_tokens=3, deadline=999.0)  # expired on arrival
    # Its first compile starts the compile helper (seconds): still in the grammar queue at expiry.
    submit(io, "gram", [6] * 5, max_new_tokens=400, deadline=1010.0, regex="[0-9]{1,400}")
    if overlap:
        for _ in range(6):
            sched.step()
        now[0] = 1010.0  # the deadline passes with a forward in flight
        while sched.in_flight is not None or not sched.is_idle:
            sched.step()
        results = collect(io)
        sched.check_idle_integrity()
    else:
        for _ in range(6):
            sched.step()
        now[0] = 1010.0
        results = run_until_idle(sched, io)  # also checks that nothing leaked
    for rid in ("run", "chunk", "wait", "past", "gram"):
        finish = results[rid]["finish"]
        assert finish["type"] == "abort" and "deadline" in finish["message"], (rid, finish)
        assert results[rid]["finishes"] == 1
    assert results["run"]["ids"]  # it ran before its deadline
    assert results["late"]["finish"]["type"] == "length" and len(results["late"]["ids"]) == 3
    assert sched.state()["deadline_expired"] == 5 and sched.state()["integrity"] == "ok"


def test_abort_and_deadline_while_in_the_grammar_queue(tiny_model: str) -> None:
    """Requests held in the grammar queue by a compile that takes long: an abort and a deadline
    both end them there, and nothing is left behind."""
    from transformers import AutoTokenizer

    from runtime.contracts.messages import AbortReq
    from scheduler.grammar import GrammarBackend
    from scheduler.grammar_queue import GrammarQueue
    from tests.scheduler.harness import VOCAB
    from tests.scheduler.slow_grammar import SLOW_MARKER, slow_compile

    sched, io = make(tiny_model)
    backend = GrammarBackend(AutoTokenizer.from_pretrained(tiny_model), VOCAB, stop_token_ids=[2],
                             compile_fn=slow_compile)
    sched.queues.grammars = GrammarQueue(lambda: backend)
    now = [1000.0]
    sched.lifecycle.clock = lambda: now[0]
    try:
        submit(io, "aborted", [5, 6], max_new_tokens=4, regex=f"{SLOW_MARKER}|a")
        submit(io, "expired", [5, 7], max_new_tokens=4, regex=f"{SLOW_MARKER}|b", deadline=1005.0)
        sched.step()
        assert {r.rid for r in sched.queues.grammars.pending} == {"aborted", "expired"}
        io.inbox.append(AbortReq("aborted"))
        now[0] = 1005.0
        results = run_until_idle(sched, io)  # also checks that nothing leaked
        assert results["aborted"]["finish"]["message"] == "aborted by request"
        assert "deadline" in results["expired"]["finish"]["message"]
        assert sched.queues.grammars.pending == []
    finally:
        backend.shutdown()


@pytest.mark.parametrize("overlap", [False, True], ids=["plain", "overlap"])
def test_finished_requests_leave_the_deadlines_under_steady_load(tiny_model: str, overlap: bool) -> None:
    """With a request timeout and the scheduler never idle, requests that finish long before
    their deadline leave the deadline structure at once: it stays bounded by the live requests
    and no request is reachable from it."""
    from scheduler.request import Req

    sched, io = make(tiny_model, disable_overlap_schedule=not overlap)
    sched.lifecycle.clock = lambda: 1000.0
    submit(io, "keeper", [4] * 6, max_new_tokens=480, deadline=1e9)  # never idle: it outlasts the loop
    submitted = 0
    live = sched.lifecycle.live
    for _ in range(300):
        while len(live) + len(io.inbox) < 4:  # steady load: a few in flight at all times
            submit(io, f"r{submitted}", [5 + submitted % 50] * 6, max_new_tokens=3, deadline=1e9)
            submitted += 1
        sched.step()
        assert not sched.is_idle
        d = sched.lifecycle.deadlines
        assert len(d) <= len(live) and d.heap_size <= max(2 * len(live), MIN_COMPACT)
    finished = sum(r["finish"] is not None for r in collect(io).values())
    assert finished > 3 * MIN_COMPACT  # far more than the heap may ever hold
    assert not any(isinstance(x, Req) for x in reachable(sched.lifecycle.deadlines))
    sched.check_integrity()


@pytest.mark.parametrize("overlap", [False, True], ids=["plain", "overlap"])
def test_deadline_passes_mid_chunked_prefill(tiny_model: str, overlap: bool) -> None:
    """A long prompt prefilled in small chunks: its deadline passes between two chunks, so it
    ends aborted from the mid-chunk state, and nothing leaks."""
    sched, io = make(tiny_model, chunked_prefill_size=8, disable_overlap_schedule=not overlap)
    now = [1000.0]
    sched.lifecycle.clock = lambda: now[0]
    submit(io, "long", list(range(3, 83)), max_new_tokens=4, deadline=1001.0)
    for _ in range(3):
        sched.step()
    chunked = sched.queues.chunked
    assert chunked is not None and chunked.rid == "long"
    assert 0 < chunked.computed < 80  # some chunks done, more to go
    now[0] = 1001.0
    sched.step()
    assert sched.queues.chunked is None
    while sched.in_flight is not None or not sched.is_idle:
        sched.step()
    sched.check_idle_integrity()
    results = collect(io)
    finish = results["long"]["finish"]
    assert finish["type"] == "abort" and "deadline" in finish["message"], finish
    assert results["long"]["finishes"] == 1 and results["long"]["ids"] == []
    assert sched.state()["deadline_expired"] == 1 and sched.state()["integrity"] == "ok"
