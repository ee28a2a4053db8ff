"""Request deadlines: a min-heap of (deadline, request), so each step finds the expired ones in
O(log n) per request instead of scanning every queue. Pure Python, no clocks of its own: the
scheduler passes `now` (wall-clock seconds, the clock the main process stamped the deadline with).
"""

from __future__ import annotations

import heapq
import itertools
from typing import Protocol


class HasDeadline(Protocol):
    rid: str
    deadline: float | None

    @property
    def finished(self) -> bool: ...


class Deadlines:
    def __init__(self) -> None:
        self._heap: list[tuple[float, int, HasDeadline]] = []
        self._order = itertools.count()  # ties: first in, first out; never compares requests
        self.expired_count = 0

    def __len__(self) -> int:
        return len(self._heap)

    def add(self, req: HasDeadline) -> None:
        if req.deadline is not None:
            heapq.heappush(self._heap, (req.deadline, next(self._order), req))

    def pop_expired(self, now: float) -> list[HasDeadline]:
        """The unfinished requests whose deadline is <= now (finished ones are dropped silently)."""
        out = []
        while self._heap and self._heap[0][0] <= now:
            req = heapq.heappop(self._heap)[2]
            if not req.finished:
                out.append(req)
        self.expired_count += len(out)
        return out

    def clear(self) -> None:
        self._heap.clear()
