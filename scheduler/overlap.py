"""The overlap loop: schedule and launch batch N+1 before processing the result of batch N.

The forward runs on a worker thread (torch releases the GIL inside its ops; on CUDA the same
thread would drive a forward stream), so the scheduler's Python work for N+1 and for N's result
overlaps the model forward. The token each request sampled at N stays on the device in the
runner's future map (indexed by request row); N+1's decode reads its input from there.

What overlap implies, and how it is handled:
- A request that finishes at N was already scheduled into N+1. It is released when N is
  processed (its in-flight slot with it, see `Scheduler.release`), reported finished once then,
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

import time
from concurrent.futures import Future, ThreadPoolExecutor

from runtime.execution.model_runner import ForwardResult
from scheduler.batch import ScheduledBatch
from scheduler.request import needs_history
from scheduler.scheduler import Scheduler

Pending = tuple[ScheduledBatch, "Future[ForwardResult]"]


class OverlapScheduler(Scheduler):
    """The scheduler with its own overlapped loop (`--disable-overlap-schedule` uses the base)."""

    def event_loop(self) -> None:
        worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="forward")
        try:
            pending: Pending | None = None
            while not self.stopped or pending is not None:
                pending = self.overlap_step(worker, pending)
        finally:
            worker.shutdown(wait=True)

    def overlap_step(self, worker: ThreadPoolExecutor, pending: Pending | None) -> Pending | None:
        for msg in self.io.recv(block=self.is_idle and pending is None):
            self.dispatch(msg)
        start = time.perf_counter()
        self.admit_compiled_grammars()
        self.expire_overdue()
        if pending is not None and not self.can_overlap(pending[0]):
            self.finish(pending)
            pending = None
        batch = None if self.stopped else self.next_batch()
        launched = (batch, worker.submit(self.runner.forward, batch.entries)) if batch else None
        if pending is not None:
            self.finish(pending)
        if launched is None:
            if self.finished_out:
                self.send_outputs(None)
            if self.is_idle and not self.checked_idle:
                self.on_idle()
        else:
            self.checked_idle = False
        if pending is not None or launched is not None:
            self.busy_s += time.perf_counter() - start
        self.progress_at = time.monotonic()
        return launched

    def can_overlap(self, last: ScheduledBatch) -> bool:
        """Schedule the next batch before `last` is processed? Not after a prefill (its
        requests join the running set only once processed), and not when a running request's
        next sampling needs the exact output `last` will produce."""
        if last.is_prefill or not self.decode_fits():  # retraction must see settled requests
            return False
        if self.urgent_victims()[1]:  # so must a preemption
            return False
        return not any(needs_history(r) or r.grammar is not None for r in self.running)

    def finish(self, pending: Pending) -> None:
        batch, future = pending
        self.process_result(batch, future.result())
        self.send_outputs(batch)
