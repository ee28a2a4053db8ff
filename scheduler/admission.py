"""Admission: this round's prefill budgets, and moving waiting requests into a prefill.

The budgets (scheduler/policy.py's PrefillAdder) are KV beyond what running requests will still
take (`new_token_ratio` of their remaining output), prefill tokens, the chunk size, and request
rows (max_running_requests and free rows).
"""

from __future__ import annotations

import time

from runtime.contracts.config import ServerConfig
from scheduler.kv_ledger import KVLedger
from scheduler.policy import PrefillAdder, order_waiting
from scheduler.priority import PriorityRules
from scheduler.queues import ReqQueues
from scheduler.request import Req
from scheduler.retract import NewTokenRatio, reserved_kv


class Admission:
    """Owns the admission limits (rows, chunk size) and builds each round's PrefillAdder."""

    def __init__(
        self,
        config: ServerConfig,
        queues: ReqQueues,
        ledger: KVLedger,
        ratio: NewTokenRatio,
        priority: PriorityRules | None,
    ) -> None:
        self.config = config
        self.queues = queues
        self.ledger = ledger
        self.ratio = ratio
        self.priority = priority  # None: priorities are not used
        rows = ledger.rows.size
        self.max_running = min(config.max_running_requests or rows, rows)
        chunk = config.chunked_prefill_size
        self.chunk_size = chunk if chunk and chunk > 0 else None  # None: no chunking

    def new_adder(self) -> PrefillAdder:
        """This round's budgets, with the mid-chunk request (if any) not yet added."""
        q, ps = self.queues, self.ledger.page_size
        # Mixed with the running decodes, the forward's token budget covers their tokens too,
        # but the prompts keep at least half of it, so a mid-chunk prompt always progresses.
        decoding = len(q.running) if self.config.enable_mixed_chunk else 0
        max_prefill = self.config.max_prefill_tokens
        chunk = self.chunk_size
        return PrefillAdder(
            cache=self.ledger.cache,
            page_size=ps,
            reserved=sum(reserved_kv(r, self.ratio.value, ps) for r in q.running),
            rem_input=max(max_prefill - decoding, max_prefill // 2),
            rem_chunk=None if chunk is None else max(chunk - decoding, chunk // 2),
            rem_reqs=min(self.max_running - q.num_running(), self.ledger.rows.available())
            + (q.chunked is not None),
        )

    def admit_waiting(self, adder: PrefillAdder) -> None:
        """Add waiting requests in the policy's order until one does not fit."""
        cache = self.ledger.cache
        order = order_waiting(self.queues.waiting, self.config.schedule_policy, cache)
        if self.priority is not None:
            order = self.priority.order(order, time.monotonic())
        shared = SharedPrefixes()
        for req in order:
            if not adder.budget_left() or adder.new_chunked is not None:
                break
            match = cache.match(req.fill_ids[: req.max_prefix_len()], req.extra_key)
            if req.embed and shared.defer(req, len(match.indices)):
                continue
            cache.lock(match.node)
            cached = len(match.indices)
            plan = self.ledger.tier_plan(req, cached)
            if not adder.try_add(req, match.indices, len(req.fill_ids) - cached - plan.tokens):
                cache.unlock(match.node)
                break
            self.ledger.bind(req, match)
            load = self.ledger.load_from_tier(req, plan)
            if load < plan.tokens:  # a corrupt block: compute those tokens after all
                adder.admitted[-1] = (req, adder.admitted[-1][1] + plan.tokens)
            if req.admitted_at is None:
                req.admitted_at = time.monotonic()
            if not req.output:  # a retracted request's re-admission is not a prompt cache hit
                req.cached_tokens = cached + load
                self.ledger.pins.admit(req, req.cached_tokens)
            self.queues.admitted(req)

    def fits_now(self, req: Req) -> bool:
        """Would `req` be admitted if it were first in the queue (a row, then its KV)?"""
        adder = self.new_adder()
        if adder.rem_reqs <= 0:
            return False
        cached = len(self.ledger.cache.match(req.fill_ids[: req.max_prefix_len()], req.extra_key).indices)
        return adder.kv_fits(req, cached)


SHARED_PREFIX_TOKENS = 32  # uncached tokens two embed inputs must share before the second waits


class SharedPrefixes:
    """One round's embed requests by the start of their uncached part. An embed input that starts
    like one admitted this round waits for the next round, when that one's prefix is in the cache:
    inputs of one request that share a long prefix (a rerank's documents under one instruction)
    compute it once, not once each. Generation requests are never held back here."""

    def __init__(self) -> None:
        self.keys: set[tuple[str | None, tuple[int, ...]]] = set()

    def defer(self, req: Req, cached: int) -> bool:
        """True when `req` should wait a round; else it is recorded as admitted this round."""
        if len(req.fill_ids) - cached < 2 * SHARED_PREFIX_TOKENS:
            return False
        key = (req.extra_key, tuple(req.fill_ids[: cached + SHARED_PREFIX_TOKENS]))
        if key in self.keys:
            return True
        self.keys.add(key)
        return False
