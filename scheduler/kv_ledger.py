"""The KV ledger: which request holds which request row and KV slots, and the only code that
hands them out to requests or takes them back.

A request holds a row and KV from its admission into a prefill until it finishes or is
retracted (`Req` documents the layout of `kv`). Released KV goes to the radix cache and, with a
KV tier, its new blocks on to the store (scheduler/kv_tier.py); a released request's pin is made
then (scheduler/pins.py). Memory invariant, at every step boundary:

    free + evictable + protected + held by requests == total KV slots
    free rows + rows in `holding` == all rows
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from radix.prefix_cache import BasePrefixCache
from radix.tree import MatchResult
from scheduler.interfaces import RowPool
from scheduler.pins import Pins
from scheduler.request import Req
from scheduler.retract import decode_slots_needed
from scheduler.speculative import trim_kv
from scheduler.tier_costs import NO_PLAN, TierPlan

if TYPE_CHECKING:  # torch loads with the tier only
    from scheduler.kv_tier import KVTier


class KVLedger:
    """Owns the prefix cache, the request rows and which request holds which."""

    def __init__(
        self, cache: BasePrefixCache, rows: RowPool, page_size: int, pin_max_tokens: int = 0
    ) -> None:
        self.cache = cache
        self.rows = rows
        self.page_size = page_size
        self.tier: KVTier | None = None  # set by the scheduler when --kv-tier-gb / --kv-store
        self.pins = Pins(cache, pin_max_tokens)
        # NOTE: also covers requests admitted into a prefill still in flight (overlap), which
        # are in no queue yet: this is the one complete list of requests holding memory.
        self.holding: dict[int, Req] = {}  # request row -> the request that holds it (and KV)

    def room(self) -> int:
        """KV slots obtainable now: free ones and evictable cached ones."""
        return self.cache.available() + self.cache.evictable_size

    def decode_fits(self, running: list[Req]) -> bool:
        """Can every request in `running` decode one more token?"""
        return decode_slots_needed(running, self.page_size) <= self.room()

    def bind(self, req: Req, match: MatchResult) -> None:
        """Admission: give `req` a row and its (already locked) cached prefix `match`."""
        row = self.rows.alloc()
        assert row is not None, "admission counts free rows"
        self.holding[row] = req
        req.row, req.kv, req.prefix_len, req.node = row, list(match.indices), len(match.indices), match.node
        req.row_synced = 0

    def tier_plan(self, req: Req, cached: int) -> TierPlan:
        """What the KV tier offers `req` past its `cached` pool prefix."""
        if self.tier is None:
            return NO_PLAN
        limit = req.max_prefix_len()
        hashes = self.cache.block_hashes(req.fill_ids[:limit], req.extra_key, req.block_hashes)
        return self.tier.plan(hashes, cached, limit)

    def load_from_tier(self, req: Req, plan: TierPlan) -> int:
        """After `bind`: carry out `plan`, giving `req` slots for the tokens it loads and filling
        them. Returns the tokens loaded, 0 when a block was corrupt (then nothing is held)."""
        if self.tier is None:
            return 0
        self.tier.count(plan)
        n = plan.tokens
        if n == 0:
            return 0
        start = req.computed
        ok = self.extend(req, n)
        assert ok, "admission reserved this KV"
        if self.tier.load(req.block_hashes, start, req.kv[start:]):
            return n
        self.trim(req, start)
        return 0

    def extend(self, req: Req, n: int) -> bool:
        """`n` more KV slots for `req`'s next tokens; False when the pool cannot give them."""
        slots = self.cache.alloc_extend(req.kv, n)
        if slots is None:
            return False
        req.kv.extend(slots)
        return True

    def trim(self, req: Req, keep: int) -> None:
        """Drop `req`'s slots past `keep` (rejected drafts, scheduler/speculative.py)."""
        trim_kv(self.cache, req, keep, self.page_size)

    def cache_unfinished(self, req: Req) -> None:
        """Publish a continuing request's computed tokens to the cache; re-point its row."""
        assert req.node is not None
        update = self.cache.cache_unfinished(
            req.fill_ids[: req.computed], req.kv, req.prefix_len, req.node, req.extra_key, req.block_hashes
        )
        req.kv, req.prefix_len, req.node = list(update.kv), update.prefix_len, update.node
        req.row_synced = 0  # canonical slots may differ from what the row holds

    def release(self, req: Req) -> None:
        """Hand a request's KV to the cache and free its row (idempotent).

        Under overlap a request may hold one slot beyond its known tokens (the in-flight token's);
        that slot is freed here unless it shares a page with the kept ones.
        """
        if req.row is None:
            return
        assert req.node is not None
        tokens = req.fill_ids[: req.computed]
        kv, extra = req.kv[: len(tokens)], req.kv[len(tokens) :]
        if extra and len(kv) % self.page_size == 0:
            self.cache.free(extra[:1])
        self.cache.cache_finished(tokens, kv, req.prefix_len, req.node, req.extra_key, req.block_hashes)
        if self.tier is not None:
            self.tier.save(tokens, req.extra_key, req.block_hashes)
        self.pins.make(req)
        del self.holding[req.row]
        self.rows.free(req.row)
        req.row, req.kv, req.prefix_len, req.node = None, [], 0, None

    def poll(self) -> None:
        """Per step: apply the tier's finished writes, end expired pins."""
        if self.tier is not None:
            self.tier.poll()
        self.pins.expire()

    def wait_for_tier_writes(self) -> bool:
        """Under KV pressure: wait for the tier's writes, whose locks keep their KV from eviction.
        Returns whether there were any."""
        if self.tier is None or not self.tier.writing:
            return False
        self.tier.drain()
        return True

    def flush(self) -> bool:
        """/flush_cache (nothing running): unpin, empty the tree and the tier store."""
        self.pins.clear()
        if self.tier is not None:
            self.tier.drain()
        flushed = self.cache.flush()
        if self.tier is not None:
            self.tier.clear()
        return flushed

    def held_slots(self) -> int:
        return sum(self.cache.owned_slots(r.computed, r.prefix_len) for r in self.holding.values())

    def check_integrity(self) -> None:
        """The memory invariant, walking the whole KV pool and tree (tests; idle time)."""
        self.cache.check_integrity(held_by_requests=self.held_slots())
        self.rows.check_integrity()
        if self.tier is not None:
            self.tier.check_integrity()

    def check_counts(self) -> None:
        """The memory invariant from counters only, in O(running requests)."""
        self.cache.check_counts(held_by_requests=self.held_slots())
        assert self.rows.available() == self.rows.size - len(self.holding), "request rows leaked"

    def check_idle_integrity(self) -> None:
        """Nothing is held: every slot is free or cached, every row free, and the only locks
        are pins (the tier's writes are waited for first)."""
        if self.tier is not None:
            self.tier.drain()
            self.tier.check_integrity()
        self.cache.check_idle_integrity(pinned=self.pins.pinned_tokens())
        self.rows.check_integrity()
        assert self.rows.available() == self.rows.size, (
            f"request rows leaked: {self.rows.size - self.rows.available()} held while idle"
        )
