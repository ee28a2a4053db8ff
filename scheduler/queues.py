"""Where each live request waits or runs, between arrival and the send of its end.

    grammars.pending   its grammar is compiling (scheduler/grammar_queue.py)
    waiting            queued for a prefill: new, or retracted (output kept)
    chunked            the one request whose prompt is mid-way through chunks (at most one)
    running            prompt done; decoding one token per step
    finished_out       ended outside a forward (abort, rejection); reported at the next send

A request is in at most one of them. Under overlap a request admitted into a prefill that is
still in flight is in none (the KV ledger's `holding` still has it).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

from scheduler.grammar_queue import GrammarQueue
from scheduler.request import Req


@dataclass(eq=False)
class ReqQueues:
    """The queues of live requests (see the module docstring)."""

    grammars: GrammarQueue
    waiting: list[Req] = field(default_factory=list)
    running: list[Req] = field(default_factory=list)
    chunked: Req | None = None
    finished_out: list[Req] = field(default_factory=list)

    def remove(self, req: Req) -> None:
        """Take `req` out of whichever queue holds it (a no-op where it is not)."""
        if req is self.chunked:
            self.chunked = None
        for queue in (self.grammars.pending, self.waiting, self.running):
            with contextlib.suppress(ValueError):  # an identity scan in C; not in this one
                queue.remove(req)

    @property
    def empty(self) -> bool:
        return (
            not self.waiting and not self.running and self.chunked is None and not self.finished_out
            and not self.grammars.pending
        )

    @property
    def has_batchable(self) -> bool:
        """Something a forward could run now (not only compiles or reports)."""
        return bool(self.waiting or self.running or self.chunked is not None)

    def num_running(self) -> int:
        """Requests holding KV in a queue: the running ones and the mid-chunk one."""
        return len(self.running) + (self.chunked is not None)

    def num_waiting(self) -> int:
        return len(self.waiting) + len(self.grammars.pending)
