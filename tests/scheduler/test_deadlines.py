"""Request deadlines: the heap (pure), and the scheduler aborting overdue requests in every state
(waiting, running, mid-chunk, in the grammar queue), freeing what they hold."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import pytest

from scheduler.deadlines import Deadlines
from tests.scheduler.harness import collect, make, run_until_idle, submit


@dataclass
class R:
    rid: str
    deadline: float | None
    finished: bool = False


def test_heap_pops_due_unfinished_requests_in_deadline_order() -> None:
    d = Deadlines()
    a, b, c, done, none = R("a", 3.0), R("b", 1.0), R("c", 9.0), R("done", 0.5, finished=True), R("x", None)
    for r in (a, b, c, done, none):
        d.add(r)
    assert len(d) == 4  # no deadline: not tracked
    assert d.pop_expired(0.1) == []
    assert d.pop_expired(3.0) == [b, a]  # `done` finished meanwhile: dropped
    assert d.expired_count == 2 and len(d) == 1
    d.clear()
    assert d.pop_expired(100.0) == []


@pytest.mark.parametrize("overlap", [False, True], ids=["plain", "overlap"])
def test_overdue_requests_end_with_abort_in_every_state(tiny_model: str, overlap: bool) -> None:
    sched, io = make(tiny_model, chunked_prefill_size=8, max_running_requests=1,
                     disable_overlap_schedule=not overlap)
    now = [1000.0]
    sched.clock = lambda: now[0]
    submit(io, "run", [5] * 10, max_new_tokens=400, deadline=1010.0)
    submit(io, "chunk", list(range(3, 60)), max_new_tokens=400, deadline=1010.0)  # waits, then chunks
    submit(io, "wait", [7] * 5, max_new_tokens=400, deadline=1010.0)
    submit(io, "late", [7] * 5, max_new_tokens=3, deadline=5000.0)  # finishes normally
    submit(io, "past", [6] * 5, max_new_tokens=3, deadline=999.0)  # expired on arrival
    # Its first compile starts the compile helper (seconds): still in the grammar queue at expiry.
    submit(io, "gram", [6] * 5, max_new_tokens=400, deadline=1010.0, regex="[0-9]{1,400}")
    if overlap:
        with ThreadPoolExecutor(1) as worker:
            pending = None
            for _ in range(6):
                pending = sched.overlap_step(worker, pending)
            now[0] = 1010.0  # the deadline passes with a forward in flight
            while pending is not None or not sched.is_idle:
                pending = sched.overlap_step(worker, pending)
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

    from runtime.messages import AbortReq
    from scheduler.grammar import GrammarBackend
    from scheduler.grammar_queue import GrammarQueue
    from tests.scheduler.harness import VOCAB
    from tests.scheduler.slow_grammar import SLOW_MARKER, slow_compile

    sched, io = make(tiny_model)
    backend = GrammarBackend(AutoTokenizer.from_pretrained(tiny_model), VOCAB, stop_token_ids=[2],
                             compile_fn=slow_compile)
    sched.grammars = GrammarQueue(lambda: backend)
    now = [1000.0]
    sched.clock = lambda: now[0]
    try:
        submit(io, "aborted", [5, 6], max_new_tokens=4, regex=f"{SLOW_MARKER}|a")
        submit(io, "expired", [5, 7], max_new_tokens=4, regex=f"{SLOW_MARKER}|b", deadline=1005.0)
        sched.step()
        assert {r.rid for r in sched.grammars.pending} == {"aborted", "expired"}
        io.inbox.append(AbortReq("aborted"))
        now[0] = 1005.0
        results = run_until_idle(sched, io)  # also checks that nothing leaked
        assert results["aborted"]["finish"]["message"] == "aborted by request"
        assert "deadline" in results["expired"]["finish"]["message"]
        assert sched.grammars.pending == []
    finally:
        backend.shutdown()
