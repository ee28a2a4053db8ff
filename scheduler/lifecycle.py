"""Every live request by rid and by deadline, and the one way to end a request between steps.

A request is live from its arrival until its end has been sent (`forget`). Ending it early
(an abort, an expired deadline, a request that can never fit) frees exactly what it holds,
wherever it is, and reports it once: at the next send, from `queues.finished_out`.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from scheduler.deadlines import Deadlines
from scheduler.kv_ledger import KVLedger
from scheduler.queues import ReqQueues
from scheduler.request import Req
from scheduler.rid_index import RidIndex


class Lifecycle:
    """Owns the rid index and the deadlines; ends requests early, wherever they are."""

    def __init__(self, queues: ReqQueues, ledger: KVLedger) -> None:
        self.queues = queues
        self.ledger = ledger
        self.live: RidIndex[Req] = RidIndex()  # every request from arrival until its end is sent
        self.deadlines = Deadlines()  # rids of live requests with a deadline (never the Req)
        self.deadline_expired = 0  # requests aborted because their deadline passed
        self.clock: Callable[[], float] = time.time  # the deadlines' clock (tests move it by hand)

    @property
    def idle(self) -> bool:
        """No request anywhere: in no queue, holding no memory, with nothing left to report."""
        return self.queues.empty and not self.ledger.holding

    def track(self, req: Req) -> None:
        self.live.add(req)
        self.deadlines.add(req)

    def forget(self, req: Req) -> None:
        """A finished request's end is sent: drop it from the rid index and the deadlines, the
        last scheduler structures that referred to it."""
        if self.live.by_rid.get(req.rid) is req:  # not a later request that reused its rid
            self.deadlines.remove(req.rid)
        self.live.remove(req)

    def reject(self, req: Req, message: str, param: str | None = None) -> None:
        """Refuse a request before it ran; with `param`, the client gets a 400 naming it."""
        req.abort(message, param)
        self.queues.ended(req)

    def finish_now(self, req: Req, message: str) -> None:
        """Abort a request that is in no queue: free exactly what it holds, report it once."""
        req.abort(message)
        self.ledger.release(req)
        self.queues.ended(req)

    def abort(self, reqs: list[Req], message: str) -> None:
        """Abort these requests wherever they are: the grammar queue, waiting, mid-chunk,
        running, or admitted into a prefill still in flight (overlap: in no queue yet)."""
        for req in reqs:
            if req.finished:
                continue
            self.queues.remove(req)
            self.finish_now(req, message)

    def expire_overdue(self) -> None:
        """Abort the requests whose deadline passed, in whatever state they are."""
        rids = self.deadlines.pop_expired(self.clock())
        # NOTE: a request that finished this step is still live until its end is sent.
        expired = [r for r in map(self.live.by_rid.get, rids) if r is not None and not r.finished]
        self.deadline_expired += len(expired)
        self.abort(expired, "the request's deadline passed (its timeout)")

    def check_counts(self) -> None:
        assert len(self.deadlines) <= len(self.live), "deadlines of requests no longer live"

    def check_integrity(self) -> None:
        self.live.check_integrity()
        self.deadlines.check_integrity()

    def check_idle(self) -> None:
        assert not self.live, f"idle but {len(self.live)} requests are still indexed"
        assert not self.deadlines, f"idle but {len(self.deadlines)} deadlines are still tracked"
