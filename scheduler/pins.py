"""Prompt prefixes pinned in the radix cache for a while (Anthropic `cache_control`).

A request with `pin_prefix_len` > 0 asks that its prompt's first pin_prefix_len tokens stay cached
for `pin_ttl_s` seconds. Admission decides whether the pin fits the cap (a fraction of the pool,
counting each pin's full length, so overlapping pins are over-counted: the cap errs on the safe
side) and reports the tokens it writes (those not cached before) at once; the pin is made when the
request releases its KV into the tree: the node ending at that prefix gets one lock until the
deadline. A later pin of the same prefix extends the deadline instead of adding a lock.

Pins are locks, so the pinned tokens count as protected; while idle, protected tokens are exactly
the pinned ones (`pinned_tokens`).
"""

from __future__ import annotations

import time

from radix.prefix_cache import BasePrefixCache
from radix.tree import TreeNode
from scheduler.request import Req


class Pins:
    def __init__(self, cache: BasePrefixCache, max_tokens: int) -> None:
        self.cache = cache
        self.max_tokens = max_tokens
        self._pins: dict[int, tuple[TreeNode, float, int]] = {}  # node id -> (node, deadline, length)
        self._reserved: dict[int, int] = {}  # id(req) -> pin length, admitted but not yet pinned
        self.made = 0
        self.refused = 0

    def _held(self) -> int:
        return sum(length for _, _, length in self._pins.values()) + sum(self._reserved.values())

    def admit(self, req: Req, cached: int) -> None:
        """At admission: reserve room for the request's pin, and report what it writes."""
        length = req.pin_prefix_len
        if length <= 0 or id(req) in self._reserved:
            return
        if self._held() + length > self.max_tokens:
            self.refused += 1
            req.pinned_tokens = 0
            return
        self._reserved[id(req)] = length
        req.pinned_tokens = max(length - cached, 0)

    def make(self, req: Req) -> None:
        """After `req` released its KV into the tree: pin its prefix, if it reserved a pin and
        computed that far."""
        length = self._reserved.pop(id(req), 0)
        if length <= 0:
            return
        match = self.cache.match(req.prompt[:length], req.extra_key)
        if len(match.indices) < length - length % self.cache.page_size or match.node.parent is None:
            return  # aborted before computing its prefix
        deadline = time.monotonic() + req.pin_ttl_s
        known = self._pins.get(match.node.id)
        if known is not None and known[0] is match.node:
            self._pins[match.node.id] = (match.node, max(deadline, known[1]), known[2])
            return
        self.cache.lock(match.node)
        self._pins[match.node.id] = (match.node, deadline, len(match.indices))
        self.made += 1

    def expire(self, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        for key, (node, deadline, _) in list(self._pins.items()):
            if deadline <= now:
                del self._pins[key]
                self.cache.unlock(node)

    def clear(self) -> None:
        """Unpin everything (/flush_cache); reservations of running requests stay."""
        self.expire(float("inf"))

    def pinned_tokens(self) -> int:
        """Tokens under at least one pin (each node counted once)."""
        seen: set[int] = set()
        total = 0
        for node, _, _ in self._pins.values():
            while node.parent is not None and node.id not in seen:
                seen.add(node.id)
                total += len(node.key)
                node = node.parent
        return total

    def state(self) -> dict[str, int]:
        return {"pins": len(self._pins), "pins_made": self.made, "pins_refused": self.refused,
                "pinned_tokens": self.pinned_tokens()}
