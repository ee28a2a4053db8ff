"""The bounded in-memory store of /v1/responses (pure: no I/O, a clock passed in for tests).

    store = ResponseStore(max_count=1024, max_bytes=64 << 20, ttl=3600.0)
    store.put(rid, owner, response, history)      # after a response with store: true finishes
    store.get(rid, owner)                         # previous_response_id, GET; None: 404

A stored response keeps its response object and its whole conversation (`history`: the input
items it was given, its previous response's history before them, and its output items), so a
continuation needs no other entry: evicting an older response never breaks a newer chain.
Bounds: at most `max_count` entries and `max_bytes` bytes (each entry counts the length of its
JSON), least recently used out first; an entry unused for `ttl` seconds is gone. NOTE: an entry
bigger than `max_bytes` on its own is not stored (the caller reports store: false semantics by
a later 404, as OpenAI's expired responses do).

Ownership: an entry answers only to the owner that made it (`owner_key`: a digest of the API key
the request presented and its cache salt); anyone else gets None, exactly as for a missing id,
so ids cannot be probed across keys or tenants. Running responses (`start` .. `finish`) are kept
apart, unbounded by these caps (the admission limits bound them), so that `cancel` finds them.
"""

from __future__ import annotations

import hashlib
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson


def owner_key(authorization: str, salt: str | None) -> str:
    """Who a response belongs to: the bearer token presented (any string on a key-less server,
    so that distinct clients' keys still separate them) and the cache salt, hashed so that the
    store holds no key. NUL-joined: ("a", "bc") and ("ab", "c") stay apart."""
    scheme, _, token = authorization.partition(" ")
    bearer = token.strip() if scheme.lower() == "bearer" else ""
    raw = bearer + "\x00" + (salt if salt is not None else "\x01")
    return hashlib.sha256(raw.encode("utf-8", "surrogatepass")).hexdigest()


@dataclass(slots=True)
class Stored:
    """One finished response and the conversation it ends."""

    owner: str
    response: dict[str, Any]
    history: list[dict[str, Any]]
    size: int
    expires: float


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
        self._running: dict[str, Running] = {}

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def bytes(self) -> int:
        return self._bytes

    def put(self, rid: str, owner: str, response: dict[str, Any], history: list[dict[str, Any]]) -> bool:
        """Store a finished response (True), or not when it alone is over a cap (False)."""
        size = len(orjson.dumps([response, history]))
        self._drop(rid)
        if self.max_count == 0 or size > self.max_bytes:
            return False
        self._expire()
        while self._entries and (len(self._entries) >= self.max_count or self._bytes + size > self.max_bytes):
            self._drop(next(iter(self._entries)))
        self._entries[rid] = Stored(owner, response, history, size, self._clock() + self.ttl)
        self._bytes += size
        return True

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

    def check_integrity(self) -> None:
        """The byte count is the sum of the entries' sizes, and every cap holds."""
        total = sum(e.size for e in self._entries.values())
        assert total == self._bytes, f"store bytes {self._bytes} != {total}"
        assert len(self._entries) <= self.max_count and self._bytes <= self.max_bytes
