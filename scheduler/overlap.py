"""The overlap loop: schedule and launch batch N+1 before processing the result of batch N.

The forward runs on a worker thread (torch releases the GIL inside its ops; on CUDA the same
thread would drive a forward stream), so the scheduler's Python work for N+1 and for N's result
overlaps the model forward. The token each request sampled at N stays on the device in the
runner's future map (indexed by request row); N+1's decode reads its input from there.

What overlap implies, and how it is handled:
- A request that finishes at N was already scheduled into N+1. It is released when N is
  processed (its in-flight slot with it, see `KVLedger.release`), reported finished once then,
  and its N+1 token is dropped because it is already finished.
- Nothing the running forward reads is mutated: entries carry copies of the ids and slots they
  need, KV slots freed between steps are only reused by a later forward (the worker runs
  forwards one at a time, in order), and request rows are written by the worker itself.
- Steps that need a request's exact output history (penalties, min_new_tokens, a sampling seed,
  a grammar whose next mask depends on the token being sampled now) and the step after a
  prefill are not overlapped: the pending result is processed first, so outputs are
  identical with overlap on and off.
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from typing import NamedTuple

from scheduler.batch import ScheduledBatch
from scheduler.interfaces import StepResult
from scheduler.loop import LoopParts
from scheduler.queues import ReqQueues
from scheduler.request import needs_history
from scheduler.retractor import Retractor


class Pending(NamedTuple):
    """A launched batch whose result is not processed yet."""

    batch: ScheduledBatch
    future: Future[StepResult]


class OverlapLoop:
    """Overlaps each forward with the scheduling of the next; owns the forward thread."""

    def __init__(self, parts: LoopParts, queues: ReqQueues, retractor: Retractor) -> None:
        self.parts = parts
        self.queues = queues
        self.retractor = retractor
        self.pending: Pending | None = None
        self._worker: ThreadPoolExecutor | None = None  # made on the first step; see close()

    @property
    def in_flight(self) -> ScheduledBatch | None:
        return None if self.pending is None else self.pending.batch

    def run(self) -> None:
        try:
            while not self.parts.inbox.stopped or self.pending is not None:
                self.step()
        finally:
            self.close()

    def step(self) -> ScheduledBatch | None:
        """One iteration; returns the batch it launched (still running on return)."""
        p, pending = self.parts, self.pending
        start = p.begin(block=p.lifecycle.idle and pending is None)
        if pending is not None and not self.can_overlap(pending.batch):
            self._finish(pending)
            pending = None
        batch = None if p.inbox.stopped else p.batcher.next_batch()
        launched = None if batch is None else Pending(batch, self._submit(batch))
        if pending is not None:
            self._finish(pending)
        if launched is None:
            if self.queues.finished_out:
                p.outbox.send(None)
            p.idle_check()
        else:
            p.checked_idle = False
        p.end(start, busy=pending is not None or launched is not None)
        self.pending = launched
        return batch

    def can_overlap(self, last: ScheduledBatch) -> bool:
        """Schedule the next batch before `last` is processed? Not after a prefill (its
        requests join the running set only once processed), and not when a running request's
        next sampling needs the exact output `last` will produce."""
        running = self.queues.running
        if last.is_prefill or not self.parts.ledger.decode_fits(running):  # retraction must see settled requests
            return False
        if self.retractor.urgent_victims()[1]:  # so must a preemption
            return False
        return not any(needs_history(r) or r.grammar is not None for r in running)

    def close(self) -> None:
        """Stop the forward thread (after the forward it runs, if any)."""
        if self._worker is not None:
            self._worker.shutdown(wait=True)
            self._worker = None

    def _submit(self, batch: ScheduledBatch) -> Future[StepResult]:
        if self._worker is None:
            self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="forward")
        return self._worker.submit(self.parts.runner.forward, batch.entries)

    def _finish(self, pending: Pending) -> None:
        self.parts.results.process(pending.batch, pending.future.result())
        self.parts.processed(pending.batch)
        self.parts.outbox.send(pending.batch)
