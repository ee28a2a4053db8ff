"""The bounded in-memory store of /v1/responses (pure: no I/O, a clock passed in for tests).

    store = ResponseStore(max_count=1024, max_bytes=64 << 20, ttl=3600.0)
    store.put(rid, owner, response, history)      # after a response with store: true finishes
    store.get(rid, owner)                         # previous_response_id, GET; None: 404

A stored response keeps its response object and its whole conversation (`history`: the input
items it was given, its previous response's history before them, and its output items), so a
continuation needs no other entry: evicting an older response never breaks a newer chain.
An entry is held as its JSON bytes (decoded on use), so the byte cap counts what the store holds.
Bounds: at most `max_count` entries and `max_bytes` bytes; an entry unused for `ttl` seconds is
gone. When a new entry needs room, the owner holding the most bytes gives up its least recently
used entry first, so one client's traffic evicts its own conversations before anyone else's.
NOTE: an entry bigger than `max_bytes` on its own is not stored (a later lookup is a 404, as
OpenAI's expired responses are).

Ownership: an entry answers only to the owner that made it (`owner_key`: a digest of the API key
the request presented and its cache salt); anyone else gets None, exactly as for a missing id,
so ids cannot be probed across keys or tenants. Running responses (`start` .. `finish`) are kept
apart, unbounded by these caps (the admission limits bound them), so that `cancel` finds them.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson

from tokenizer.owner import owner_key

__all__ = ["ResponseStore", "Running", "Stored", "owner_key"]


@dataclass(slots=True)
class Stored:
    """One finished response and the conversation it ends, as JSON bytes."""

    owner: str
    data: bytes
    expires: float

    @property
    def size(self) -> int:
        return len(self.data)

    @property
    def response(self) -> dict[str, Any]:
        return dict(orjson.loads(self.data)[0])

    @property
    def history(self) -> list[dict[str, Any]]:
        return list(orjson.loads(self.data)[1])


@dataclass(slots=True)
class Running:
    """A response being generated: its latest snapshot and whether a cancel asked it to stop."""

    owner: str
    snapshot: dict[str, Any]
    cancelled: bool = False


class ResponseStore:
    """LRU by count and bytes, with a TTL refreshed on use; see the module docstring."""

    def __init__(self, max_count: int, max_bytes: int, ttl: float,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.max_count, self.max_bytes, self.ttl = max_count, max_bytes, ttl
        self._clock = clock
        self._entries: OrderedDict[str, Stored] = OrderedDict()  # least recently used first
        self._bytes = 0
        self._owned: dict[str, int] = {}  # bytes by owner
        self._running: dict[str, Running] = {}

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def bytes(self) -> int:
        return self._bytes

    def put(self, rid: str, owner: str, response: dict[str, Any], history: list[dict[str, Any]]) -> bool:
        """Store a finished response (True), or not when it alone is over a cap (False)."""
        data = orjson.dumps([response, history])
        self._drop(rid)
        if self.max_count == 0 or len(data) > self.max_bytes:
            return False
        self._expire()
        while self._entries and (len(self._entries) >= self.max_count or self._bytes + len(data) > self.max_bytes):
            self._drop(self._victim())
        self._entries[rid] = Stored(owner, data, self._clock() + self.ttl)
        self._bytes += len(data)
        self._owned[owner] = self._owned.get(owner, 0) + len(data)
        return True

    def _victim(self) -> str:
        """The least recently used entry of the owner holding the most bytes."""
        heaviest = max(self._owned, key=lambda o: self._owned[o])
        return next(rid for rid, e in self._entries.items() if e.owner == heaviest)

    def owned_bytes(self, owner: str) -> int:
        return self._owned.get(owner, 0)

    def get(self, rid: str, owner: str) -> Stored | None:
        """The owner's live entry (now the most recently used), else None."""
        self._expire()
        entry = self._entries.get(rid)
        if entry is None or entry.owner != owner:
            return None
        entry.expires = self._clock() + self.ttl
        self._entries.move_to_end(rid)
        return entry

    def delete(self, rid: str, owner: str) -> bool:
        if self.get(rid, owner) is None:
            return False
        self._drop(rid)
        return True

    def start(self, rid: str, owner: str, snapshot: dict[str, Any]) -> Running:
        """Register a response while it generates (GET shows it in progress; cancel stops it)."""
        running = self._running[rid] = Running(owner, snapshot)
        return running

    def running(self, rid: str, owner: str) -> Running | None:
        entry = self._running.get(rid)
        return entry if entry is not None and entry.owner == owner else None

    def finish(self, rid: str) -> None:
        self._running.pop(rid, None)

    def running_count(self) -> int:
        return len(self._running)

    def _expire(self) -> None:
        """Drop entries past their TTL. NOTE: use order is expiry order (each use adds the same
        ttl), so the expired entries are the oldest ones, at the front."""
        now = self._clock()
        while self._entries:
            rid, entry = next(iter(self._entries.items()))
            if entry.expires > now:
                return
            self._drop(rid)

    def _drop(self, rid: str) -> None:
        entry = self._entries.pop(rid, None)
        if entry is not None:
            self._bytes -= entry.size
            left = self._owned[entry.owner] - entry.size
            if left:
                self._owned[entry.owner] = left
            else:
                del self._owned[entry.owner]

    def check_integrity(self) -> None:
        """The byte count is the sum of the entries' sizes, and every cap holds."""
        total = sum(e.size for e in self._entries.values())
        assert total == self._bytes, f"store bytes {self._bytes} != {total}"
        owned: dict[str, int] = {}
        for e in self._entries.values():
            owned[e.owner] = owned.get(e.owner, 0) + e.size
        assert owned == self._owned, "bytes by owner disagree with the entries"
        assert len(self._entries) <= self.max_count and self._bytes <= self.max_bytes
