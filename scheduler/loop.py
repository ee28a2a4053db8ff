"""The scheduler's loops. Each iteration: receive messages -> pick the next batch -> run it ->
process its result -> send outputs; when idle, check the memory invariant once.

`PlainLoop` runs each batch to completion before picking the next; `OverlapLoop`
(scheduler/overlap.py) picks and launches batch N+1 before processing batch N. Both drive the
same `LoopParts`, which also keeps the bookkeeping they share.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from scheduler.batch import ScheduledBatch
from scheduler.batcher import Batcher
from scheduler.inbox import Inbox
from scheduler.interfaces import Runner
from scheduler.kv_events import KVEventPublisher
from scheduler.kv_ledger import KVLedger
from scheduler.lifecycle import Lifecycle
from scheduler.output import Outbox
from scheduler.results import ResultProcessor
from scheduler.retract import NewTokenRatio


@dataclass(eq=False)
class LoopParts:
    """What a loop iteration calls, and what it records."""

    runner: Runner
    inbox: Inbox
    lifecycle: Lifecycle
    ledger: KVLedger
    batcher: Batcher
    results: ResultProcessor
    outbox: Outbox
    ratio: NewTokenRatio
    events: KVEventPublisher | None = None  # --kv-events: one batch of block events per iteration
    checked_idle: bool = False  # the idle check ran since the last batch
    busy_s: float = 0.0  # wall time of iterations that ran or finished a batch
    progress_at: float = field(default_factory=time.monotonic)  # stamped by every iteration (watchdog)
    _forward_s: float = 0.0  # the runner's forward time when the last batch was processed

    def begin(self, block: bool) -> float:
        """Receive messages, then the per-step housekeeping; returns the busy-time start."""
        self.inbox.receive(block)
        start = time.perf_counter()
        self.inbox.admit_compiled_grammars()
        self.lifecycle.expire_overdue()
        self.ledger.poll()
        if self.events is not None:
            self.events.poll_replay()
        return start

    def processed(self, batch: ScheduledBatch) -> None:
        """After a batch's result: a prefill's forward time feeds the tier's cost model (prefills
        are never overlapped, so the runner's forward time since the last batch is this one's)."""
        spent, self._forward_s = self.runner.forward_s - self._forward_s, self.runner.forward_s
        tier = self.ledger.tier
        if tier is not None and batch.is_prefill:
            tier.costs.observe_prefill(sum(len(e.input_ids) for e in batch.entries), spent)

    def end(self, start: float, busy: bool) -> None:
        if self.events is not None:
            self.events.flush()
        if busy:
            self.busy_s += time.perf_counter() - start
        self.progress_at = time.monotonic()

    def idle_check(self) -> None:
        """Once per idle period: the memory invariant, and a fresh reservation ratio."""
        if self.lifecycle.idle and not self.checked_idle:
            self.check_idle_integrity()
            self.ratio.reset()
            self.checked_idle = True

    def check_idle_integrity(self) -> None:
        self.lifecycle.check_idle()
        self.ledger.check_idle_integrity()


class PlainLoop:
    """Run each batch and process its result before picking the next (--disable-overlap-schedule)."""

    def __init__(self, parts: LoopParts) -> None:
        self.parts = parts

    @property
    def in_flight(self) -> ScheduledBatch | None:
        return None  # a step returns only once its batch is processed

    def run(self) -> None:
        while not self.parts.inbox.stopped:
            self.step()

    def step(self) -> ScheduledBatch | None:
        """One iteration; returns the batch it ran."""
        p = self.parts
        start = p.begin(block=p.lifecycle.idle)
        batch = p.batcher.next_batch()
        if batch is not None:
            p.results.process(batch, p.runner.forward(batch.entries))
            p.processed(batch)
            p.checked_idle = False
        else:
            p.idle_check()
        p.outbox.send(batch)
        p.end(start, busy=batch is not None)
        return batch

    def close(self) -> None:
        pass
