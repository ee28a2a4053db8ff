"""Waiting-queue ordering and prefill admission (the PrefillAdder).

A request is admitted when the KV pool (free + evictable) minus what running requests are
expected to still take (`retract.reserved_kv`) covers its uncomputed tokens and its clipped
output (`retract.admission_kv`). A pool too small for everyone at once admits fewer at a time;
when the optimistic reservations fall short during decode, the scheduler retracts.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from radix.prefix_cache import BasePrefixCache
from scheduler.request import Req
from scheduler.retract import admission_kv

LPM_FCFS_FALLBACK = 128  # longest-prefix-match sorting costs a tree walk per waiting request


def order_waiting(queue: list[Req], policy: str, cache: BasePrefixCache) -> list[Req]:
    """The waiting queue in the order the policy admits it (stable, FCFS among equals)."""
    if policy == "fcfs" or len(queue) > LPM_FCFS_FALLBACK:
        return list(queue)
    if policy == "lpm":
        hits = {id(r): len(cache.match(r.fill_ids[: r.max_prefix_len()], r.extra_key).indices) for r in queue}
        return sorted(queue, key=lambda r: -hits[id(r)])
    raise ValueError(f"unknown schedule policy {policy!r}")


@dataclass
class PrefillAdder:
    """Packs waiting requests into one prefill batch under the KV, token and chunk budgets."""

    cache: BasePrefixCache
    page_size: int
    reserved: int  # KV that running requests will still need
    rem_input: int  # prefill tokens left in this batch
    rem_chunk: int | None  # chunk budget; None: chunking disabled
    rem_reqs: int  # request slots left (max_running_requests and free rows)
    admitted: list[tuple[Req, int]] = field(default_factory=list)  # (request, tokens to compute)
    new_chunked: Req | None = None

    def rem_kv(self) -> int:
        return self.cache.available() + self.cache.evictable_size - self.reserved

    def budget_left(self) -> bool:
        return self.rem_input > 0 and (self.rem_chunk is None or self.rem_chunk > 0) and self.rem_reqs > 0

    def try_add(self, req: Req, prefix: list[int], extend: int) -> bool:
        """Admit `req` (its locked prefix match already in `prefix`) computing up to `extend`
        tokens now; returns False when it does not fit (the caller stops admitting)."""
        total_need = admission_kv(req, self.page_size) - len(prefix)
        if total_need > self.rem_kv():
            return False
        if self.admitted and extend > self.rem_input:
            return False
        if self.rem_chunk is not None and extend > self.rem_chunk:
            extend = self.rem_chunk // self.page_size * self.page_size
            if extend <= 0:
                return False
            self.new_chunked = req
        self.admitted.append((req, extend))
        self.reserved += total_need
        self.rem_input -= extend
        if self.rem_chunk is not None:
            self.rem_chunk -= extend
        self.rem_reqs -= 1
        return True
