"""Priority scheduling (`--enable-priority-scheduling`): the waiting queue by urgency, preemption
of less urgent running requests, and aging so that nothing starves.

Urgency is the request's `priority` (larger is more urgent, SGLang's default;
`--schedule-low-priority-values-first` flips the sign), except that a request that has waited
`--priority-aging-timeout` seconds since it arrived ranks above every priority: aged requests go
first, among themselves in the policy's order, and are never preempted. So a low-priority
request waits at most the aging timeout behind newer urgent ones (then whatever the aged ahead of
it need).

Preemption: when the most urgent waiting request cannot be admitted (rows or KV short), running
requests whose urgency is lower by more than `--priority-scheduling-preemption-threshold` are
retracted, least urgent first (then the latest to arrive), until it fits. An aged request does
not preempt: it is next anyway. Retraction keeps their
output and their computed KV goes to the prefix cache, so they resume where they were. A request
is preempted at most MAX_PREEMPTIONS times, then it keeps its place.

Pure functions over `Req`s; the scheduler owns the queues.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from runtime.contracts.config import ServerConfig
from scheduler.request import Req

MAX_PREEMPTIONS = 3  # per request: beyond it a low-priority request is not preempted again


@dataclass(frozen=True)
class PriorityRules:
    low_values_first: bool
    threshold: int
    aging_s: float  # 0: no aging
    max_preemptions: int = MAX_PREEMPTIONS

    @classmethod
    def from_config(cls, config: ServerConfig) -> PriorityRules | None:
        if not config.enable_priority_scheduling:
            return None
        return cls(config.schedule_low_priority_values_first, config.priority_scheduling_preemption_threshold,
                   config.priority_aging_timeout)

    def urgency(self, req: Req, now: float) -> float:
        """How urgent `req` is at monotonic time `now` (larger first; aged: infinite)."""
        if self.aging_s and now - req.arrival >= self.aging_s:
            return math.inf
        return float(-req.priority if self.low_values_first else req.priority)

    def order(self, queue: list[Req], now: float) -> list[Req]:
        """`queue` (in the policy's order) by urgency; the sort is stable, so ties keep the policy's order."""
        return sorted(queue, key=lambda r: -self.urgency(r, now))

    def victims(self, candidate: Req, running: list[Req], now: float) -> list[Req]:
        """Running requests `candidate` may preempt, the first to retract first."""
        bar = self.urgency(candidate, now) - self.threshold
        if math.isinf(bar):  # an aged request only goes first; it never preempts (nothing starves
            return []        # without it: running requests end, and it is next)
        able = [r for r in running if r.preemptions < self.max_preemptions and self.urgency(r, now) < bar]
        return sorted(able, key=lambda r: (self.urgency(r, now), -r.arrival))
