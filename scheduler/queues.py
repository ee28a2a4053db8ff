"""Where each live request waits or runs, between arrival and the send of its end.

    grammars.pending   its grammar is compiling (scheduler/grammar_queue.py)
    waiting            queued for a prefill: new, or retracted (output kept)
    chunked            the one request whose prompt is mid-way through chunks (at most one)
    running            prompt done; decoding one token per step
    finished_out       ended outside a forward (abort, rejection); reported at the next send

A request is in at most one of them, and moves between them only through the methods below
(the one place that writes these lists). Under overlap a request admitted into a prefill that is
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

    def enqueue(self, reqs: list[Req]) -> None:
        """New (or grammar-compiled) requests to the back of the waiting queue."""
        self.waiting.extend(reqs)

    def requeue_first(self, req: Req) -> None:
        """A retracted request to the front of the waiting queue (its output kept)."""
        self.waiting.insert(0, req)

    def admitted(self, req: Req) -> None:
        """`req` left the waiting queue for a prefill."""
        self.waiting.remove(req)

    def start_running(self, req: Req) -> None:
        """Its prompt is done: it decodes from now on."""
        self.running.append(req)

    def stop_running(self, req: Req) -> None:
        """It finished, or was retracted, while running."""
        self.running.remove(req)

    def set_chunked(self, req: Req | None) -> None:
        """The one request mid-way through its prompt's chunks (None: none)."""
        self.chunked = req

    def ended(self, req: Req) -> None:
        """It ended outside a forward (an abort, a rejection): reported at the next send."""
        self.finished_out.append(req)

    def take_ended(self) -> list[Req]:
        """The requests ended outside a forward since the last send."""
        ended, self.finished_out = self.finished_out, []
        return ended

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
