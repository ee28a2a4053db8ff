"""Retraction and preemption: sending running requests back to the waiting queue.

Under KV pressure (scheduler/retract.py) the least advanced requests go back until the others
can decode; with priority scheduling (scheduler/priority.py) less urgent ones go back so that
an urgent arrival fits. Either way the request keeps its output and its computed KV goes to the
prefix cache, so its re-admission usually resumes where it was.
"""

from __future__ import annotations

import time

from scheduler.admission import Admission
from scheduler.kv_ledger import KVLedger
from scheduler.lifecycle import Lifecycle
from scheduler.priority import PriorityRules
from scheduler.queues import ReqQueues
from scheduler.request import Req
from scheduler.retract import NewTokenRatio, pick_victim


class Retractor:
    """Sends running requests back to the waiting queue; owns the retraction counters."""

    def __init__(
        self,
        queues: ReqQueues,
        ledger: KVLedger,
        lifecycle: Lifecycle,
        admission: Admission,
        ratio: NewTokenRatio,
        priority: PriorityRules | None,
    ) -> None:
        self.queues = queues
        self.ledger = ledger
        self.lifecycle = lifecycle
        self.admission = admission
        self.ratio = ratio
        self.priority = priority  # None: no preemption
        self.retractions = 0  # every retraction, preemptions included
        self.preemptions = 0  # retractions for a more urgent request

    def retract(self, req: Req) -> None:
        """Back to the front of the queue, output kept; its computed KV goes to the cache."""
        self.ledger.release(req)
        self.retractions += 1
        self.queues.requeue_first(req)

    def retract_until_decode_fits(self) -> None:
        """Retract the least advanced requests until every other one can decode one more token."""
        running = self.queues.running
        retracted = False
        while running and not self.ledger.decode_fits(running):
            victim = pick_victim(running)
            running.remove(victim)
            if not running:  # alone and still too big: cannot happen for admitted sizes
                self.lifecycle.finish_now(victim, "the KV cache cannot hold this request")
                break
            self.retract(victim)
            retracted = True
        if retracted:
            self.ratio.after_retraction(running)
        else:
            self.ratio.decay()

    def urgent_victims(self) -> tuple[Req | None, list[Req]]:
        """The most urgent waiting request when it does not fit now, and the running requests
        it may preempt, first to go first (scheduler/priority.py)."""
        q = self.queues
        if self.priority is None or q.chunked is not None or not q.waiting or not q.running:
            return None, []
        now = time.monotonic()
        top = self.priority.order(q.waiting, now)[0]
        if self.admission.fits_now(top):
            return None, []
        return top, self.priority.victims(top, q.running, now)

    def preempt_for_urgent(self) -> None:
        top, victims = self.urgent_victims()
        while top is not None and victims and not self.admission.fits_now(top):
            victim = victims.pop(0)
            self.queues.stop_running(victim)
            victim.preemptions += 1
            self.preemptions += 1
            self.retract(victim)
