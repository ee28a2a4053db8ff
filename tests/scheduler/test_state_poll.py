"""State polls (GetStateReq: /get_load, /metrics, /get_server_info) are answered from counters,
never by walking the KV pool or the tree, and those counters equal what the full walk finds."""

from __future__ import annotations

import pytest

from radix.allocator import KVAllocator
from radix.prefix_cache import RadixPrefixCache
from radix.tree import RadixTree
from runtime.contracts.messages import AbortReq, GetStateReq
from scheduler.kv_ledger import KVLedger
from scheduler.scheduler import Scheduler
from tests.scheduler.harness import make, run_until_idle, submit

POOL = 1 << 17  # KV slots: a walk of this many is a visible stall, a counter read is not


def walked(sched: Scheduler) -> dict[str, int]:
    """The KV numbers a full walk of the allocator's flags and the tree computes."""
    cache = sched.ledger.cache
    assert isinstance(cache, RadixPrefixCache)
    nodes = list(cache.tree._nodes())
    return {
        "kv_available": sum(cache.allocator._is_free) * cache.page_size,
        "kv_evictable": sum(len(n.key) for n in nodes if n.lock_ref == 0),
        "kv_protected": sum(len(n.key) for n in nodes if n.lock_ref > 0),
        "rows_free": len(set(sched.ledger.rows.free_rows)),  # type: ignore[attr-defined]
    }


def poll(sched: Scheduler, monkeypatch: pytest.MonkeyPatch) -> dict:
    """Dispatch one GetStateReq with every full walk replaced by a tripwire."""
    def tripwire(*args: object, **kwargs: object) -> None:
        raise AssertionError("a state poll walked the KV pool")

    with monkeypatch.context() as m:
        for cls in (Scheduler, KVLedger, RadixPrefixCache, KVAllocator, RadixTree):
            m.setattr(cls, "check_integrity", tripwire)
        sched.dispatch(GetStateReq(7))
    out = sched.io.control.pop()
    assert out.req_id == 7
    return out.state


@pytest.mark.parametrize("page_size", [1, 4])
def test_poll_uses_counters_that_match_the_full_walk(
    tiny_model: str, monkeypatch: pytest.MonkeyPatch, page_size: int
) -> None:
    sched, io = make(tiny_model, max_total_tokens=POOL, page_size=page_size, chunked_prefill_size=16)
    shared = list(range(10, 42))
    for i in range(4):  # finished: their KV stays cached, evictable
        submit(io, f"done{i}", shared + [50 + i] * 5, max_new_tokens=3)
    run_until_idle(sched, io)
    for i in range(3):  # running on the shared prefix: protected, and held by requests
        submit(io, f"run{i}", shared + [60 + i] * 7, max_new_tokens=200)
    submit(io, "aborted", shared + [70] * 9, max_new_tokens=200)
    submit(io, "chunked", list(range(100, 180)), max_new_tokens=200)  # mid-chunk at the poll
    for _ in range(4):
        sched.step()
    io.inbox.append(AbortReq("aborted"))
    sched.step()
    assert sched.queues.running and sched.queues.chunked is not None
    state = poll(sched, monkeypatch)
    assert state["integrity"] == "ok"
    assert state["kv_protected"] > 0 and state["kv_evictable"] > 0
    assert {k: state[k] for k in walked(sched)} == walked(sched)
    sched.check_integrity()  # the full walk agrees the pool is consistent


def test_poll_still_reports_a_counter_violation(tiny_model: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A slot taken behind the cache's back breaks the counted equation: the poll says so."""
    sched, io = make(tiny_model, max_total_tokens=POOL)
    assert sched.ledger.cache.allocator.alloc(1) is not None
    state = poll(sched, monkeypatch)
    assert state["integrity"].startswith("violated: KV leak")
