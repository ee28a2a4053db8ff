"""Building each step's batch: admission of waiting requests into a prefill (with chunking and
mixed decodes), the decode batch, retraction under KV pressure and priority preemption.

A mixin of `Scheduler` (scheduler/scheduler.py), which owns the state these methods read and
change: the queues (`waiting`, `running`, `chunked`, `holding`), the prefix cache, the request
rows, the reservation ratio and the counters.
"""

from __future__ import annotations

import logging
import time

from scheduler.batch import ScheduledBatch, decode_entry, prefill_entry, speculative_entry
from scheduler.policy import PrefillAdder, order_waiting
from scheduler.request import Req, ReqState
from scheduler.retract import decode_slots_needed, pick_victim, reserved_kv
from scheduler.speculative import slots_to_extend

logger = logging.getLogger("scheduler.scheduler")


class BatchingMixin:
    """next_batch() and the admission, decode, retraction and preemption it uses."""

    def next_batch(self) -> ScheduledBatch | None:
        batch = self.next_prefill()
        if batch is None:
            return self.next_decode()
        if self.config.enable_mixed_chunk and self.running:
            self.add_decodes(batch)
        return batch

    def next_prefill(self) -> ScheduledBatch | None:
        if not self.waiting and self.chunked is None:
            return None
        if self.priority is not None:
            self.preempt_for_urgent()
        adder = self.new_adder()
        chunked = self.chunked
        if chunked is not None and not adder.try_add(chunked, [], len(chunked.fill_ids) - chunked.computed):
            self.chunked = None  # running requests grew into its room: it waits like the others
            self.retract(chunked)
        if self.chunked is None:
            self.admit_waiting(adder)
        if not adder.admitted:
            return None
        self.chunked = adder.new_chunked
        batch = ScheduledBatch(is_prefill=True)
        for req, extend in adder.admitted:
            new = self.cache.alloc_extend(req.kv, extend)
            assert new is not None, "admission reserved this KV"
            req.kv.extend(new)
            batch.add(req, prefill_entry(req, extend), prefill=True)
        return batch

    def new_adder(self) -> PrefillAdder:
        """This round's prefill budgets: KV beyond what running requests will still take, tokens,
        chunk and request rows."""
        holding = len(self.running) + (self.chunked is not None)
        # Mixed with the running decodes, the forward's token budget covers their tokens too,
        # but the prompts keep at least half of it, so a mid-chunk prompt always progresses.
        decoding = len(self.running) if self.config.enable_mixed_chunk else 0
        max_prefill = self.config.max_prefill_tokens
        return PrefillAdder(
            cache=self.cache,
            page_size=self.page_size,
            reserved=sum(reserved_kv(r, self.ratio.value, self.page_size) for r in self.running),
            rem_input=max(max_prefill - decoding, max_prefill // 2),
            rem_chunk=None if self.chunk_size is None else max(self.chunk_size - decoding, self.chunk_size // 2),
            rem_reqs=min(self.max_running - holding, self.rows.available()) + (self.chunked is not None),
        )

    def add_decodes(self, batch: ScheduledBatch) -> None:
        """Mixed chunk: every running request decodes one token in the prefill's forward, so a
        new prompt does not stall the running streams. Under KV pressure they wait for the next
        plain decode step, which retracts as needed."""
        if not self.decode_fits():
            return
        self.ratio.decay()
        self.mixed_steps += 1
        for req in self.running:
            slot = self.cache.alloc_extend(req.kv, 1)
            assert slot is not None, "decode_fits() covers one token per running request"
            req.kv.extend(slot)
            batch.add(req, decode_entry(req), prefill=False)

    def admit_waiting(self, adder: PrefillAdder) -> None:
        order = order_waiting(self.waiting, self.config.schedule_policy, self.cache)
        if self.priority is not None:
            order = self.priority.order(order, time.monotonic())
        for req in order:
            if not adder.budget_left() or adder.new_chunked is not None:
                break
            match = self.cache.match(req.fill_ids[: req.max_prefix_len()], req.extra_key)
            self.cache.lock(match.node)
            if not adder.try_add(req, match.indices, len(req.fill_ids) - len(match.indices)):
                self.cache.unlock(match.node)
                break
            row = self.rows.alloc()
            assert row is not None, "rem_reqs counts free rows"
            self.holding[row] = req
            req.row, req.kv, req.prefix_len, req.node = row, list(match.indices), len(match.indices), match.node
            req.row_synced = 0
            if req.admitted_at is None:
                req.admitted_at = time.monotonic()
            if not req.output:  # a retracted request's re-admission is not a prompt cache hit
                req.cached_tokens = len(match.indices)
            self.waiting.remove(req)

    def next_decode(self) -> ScheduledBatch | None:
        if not self.running:
            return None
        self.retract_until_decode_fits()
        batch = ScheduledBatch(is_prefill=False)
        ps = self.page_size
        spare = self.cache.available() + self.cache.evictable_size - decode_slots_needed(self.running, ps)
        speculate = self.speculator is not None and self.speculator.active(len(self.running))
        for req in list(self.running):
            drafts = self.speculator.drafts(req) if speculate else []
            if drafts:
                extra = slots_to_extend(len(req.kv), 1 + len(drafts), ps) - slots_to_extend(len(req.kv), 1, ps)
                drafts = drafts if extra <= spare else []
                spare -= extra if drafts else 0
            slot = self.cache.alloc_extend(req.kv, 1 + len(drafts))
            if slot is None:  # admission reserves decode KV, so this is a bug; keep serving
                logger.error("no KV slot for decoding request %s", req.rid)
                self.running.remove(req)
                self.finish_now(req, "out of KV cache memory")
                continue
            req.kv.extend(slot)
            batch.add(req, speculative_entry(req, drafts) if drafts else decode_entry(req), prefill=False)
        return batch if batch.reqs else None

    def decode_fits(self) -> bool:
        room = self.cache.available() + self.cache.evictable_size
        return decode_slots_needed(self.running, self.page_size) <= room

    def retract_until_decode_fits(self) -> None:
        """Retract the least advanced requests until every other one can decode one more token."""
        retracted = False
        while self.running and not self.decode_fits():
            victim = pick_victim(self.running)
            self.running.remove(victim)
            if not self.running:  # alone and still too big: cannot happen for admitted sizes
                self.finish_now(victim, "the KV cache cannot hold this request")
                break
            self.retract(victim)
            retracted = True
        if retracted:
            self.ratio.after_retraction(self.running)
        else:
            self.ratio.decay()

    def urgent_victims(self) -> tuple[Req | None, list[Req]]:
        """The most urgent waiting request when it does not fit now, and the running requests
        it may preempt, first to go first (scheduler/priority.py)."""
        if self.priority is None or self.chunked is not None or not self.waiting or not self.running:
            return None, []
        now = time.monotonic()
        top = self.priority.order(self.waiting, now)[0]
        if self.fits_now(top):
            return None, []
        return top, self.priority.victims(top, self.running, now)

    def preempt_for_urgent(self) -> None:
        top, victims = self.urgent_victims()
        while top is not None and victims and not self.fits_now(top):
            victim = victims.pop(0)
            self.running.remove(victim)
            victim.preemptions += 1
            self.preemptions += 1
            self.retract(victim)

    def fits_now(self, req: Req) -> bool:
        """Would `req` be admitted if it were first in the queue (a row, then its KV)?"""
        adder = self.new_adder()
        if adder.rem_reqs <= 0:
            return False
        cached = len(self.cache.match(req.fill_ids[: req.max_prefix_len()], req.extra_key).indices)
        return adder.kv_fits(req, cached)

    def retract(self, req: Req) -> None:
        """Back to the front of the queue, output kept; its computed KV goes to the cache."""
        self.release(req)
        req.state = ReqState.WAITING
        self.retractions += 1
        self.waiting.insert(0, req)
