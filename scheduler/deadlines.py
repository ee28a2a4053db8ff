"""Request deadlines: a min-heap of (deadline, rid) with removal by rid, so each step finds the
expired requests in O(log n) each instead of scanning every queue. Pure Python, no clocks of
its own: the scheduler passes `now` (wall-clock seconds, the clock the main process stamped the
deadline with).

It holds rids and numbers only, never a request, so a finished request's prompt, outputs and
matchers are not kept alive by it. A request leaves at once when it ends (`remove`); its heap
entry goes stale and is skipped later (lazy deletion). Stale entries are compacted away whenever
they outnumber the live ones, so the heap stays O(live requests) under any load.
"""

from __future__ import annotations

import heapq
import itertools
from typing import Protocol

# A heap this small is never worth compacting (rebuilding costs more than the entries weigh).
MIN_COMPACT = 64


class HasDeadline(Protocol):
    rid: str
    deadline: float | None


class Deadlines:
    """The deadlines of the live requests that have one, by rid."""

    def __init__(self) -> None:
        # NOTE: an entry (deadline, seq, rid) is live iff `_due[rid] == (deadline, seq)`; `seq`
        # keeps ties first in, first out and tells a re-added rid's entry from its stale one.
        self._heap: list[tuple[float, int, str]] = []
        self._due: dict[str, tuple[float, int]] = {}
        self._order = itertools.count()

    def __len__(self) -> int:
        """Requests tracked (those with a deadline that have not ended or expired)."""
        return len(self._due)

    @property
    def heap_size(self) -> int:
        """Heap entries, stale ones included: at most max(2 * len(self), MIN_COMPACT)."""
        return len(self._heap)

    def add(self, req: HasDeadline) -> None:
        if req.deadline is None:
            return
        key = (req.deadline, next(self._order))
        self._due[req.rid] = key
        heapq.heappush(self._heap, (*key, req.rid))
        self._maybe_compact()

    def remove(self, rid: str) -> None:
        """Forget `rid` (it ended); a no-op when it is not tracked."""
        if self._due.pop(rid, None) is not None:
            self._maybe_compact()

    def pop_expired(self, now: float) -> list[str]:
        """The rids whose deadline is <= now, in deadline order; they are no longer tracked."""
        out = []
        while self._heap and self._heap[0][0] <= now:
            deadline, seq, rid = heapq.heappop(self._heap)
            if self._due.get(rid) == (deadline, seq):
                del self._due[rid]
                out.append(rid)
        self._maybe_compact()
        return out

    def clear(self) -> None:
        self._heap.clear()
        self._due.clear()

    def _maybe_compact(self) -> None:
        if len(self._heap) > max(2 * len(self._due), MIN_COMPACT):
            self._heap = [(d, seq, rid) for rid, (d, seq) in self._due.items()]
            heapq.heapify(self._heap)

    def check_integrity(self) -> None:
        """Every tracked rid has its entry in the heap, and the heap is compacted."""
        live = {(d, seq, rid) for d, seq, rid in self._heap if self._due.get(rid) == (d, seq)}
        assert len(live) == len(self._due), f"{len(self._due)} tracked, {len(live)} in the heap"
        assert len(self._heap) <= max(2 * len(self._due), MIN_COMPACT), "heap not compacted"
