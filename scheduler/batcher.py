"""The batcher: picks each step's batch. Prefill first (the mid-chunk request, then admissions,
optionally mixed with the running decodes); otherwise every running request decodes one token,
with n-gram drafts where KV is spare."""

from __future__ import annotations

import logging

from runtime.contracts.config import ServerConfig
from scheduler.admission import Admission
from scheduler.batch import ScheduledBatch, decode_entry, prefill_entry, speculative_entry
from scheduler.kv_ledger import KVLedger
from scheduler.lifecycle import Lifecycle
from scheduler.queues import ReqQueues
from scheduler.request import Req
from scheduler.retract import NewTokenRatio, decode_slots_needed
from scheduler.retractor import Retractor
from scheduler.speculative import Speculator, slots_to_extend

logger = logging.getLogger("scheduler.scheduler")


class Batcher:
    """Builds each step's ScheduledBatch, allocating the KV its entries write."""

    def __init__(
        self,
        config: ServerConfig,
        queues: ReqQueues,
        ledger: KVLedger,
        lifecycle: Lifecycle,
        admission: Admission,
        retractor: Retractor,
        ratio: NewTokenRatio,
        speculator: Speculator | None,
    ) -> None:
        self.queues = queues
        self.ledger = ledger
        self.lifecycle = lifecycle
        self.admission = admission
        self.retractor = retractor
        self.ratio = ratio
        self.speculator = speculator  # None: no speculative decoding
        self.mixed = bool(config.enable_mixed_chunk)
        self.mixed_steps = 0  # forwards that ran a prefill and the running decodes together

    def next_batch(self) -> ScheduledBatch | None:
        batch = self.next_prefill()
        if batch is None:
            return self.next_decode()
        if self.mixed and self.queues.running:
            self.add_decodes(batch)
        return batch

    def next_prefill(self) -> ScheduledBatch | None:
        q = self.queues
        if not q.waiting and q.chunked is None:
            return None
        self.retractor.preempt_for_urgent()  # a no-op without priority scheduling
        batch = self._try_prefill()
        if batch is None and not q.running and self.ledger.wait_for_tier_writes():
            batch = self._try_prefill()  # the writes' locked KV is evictable now
        return batch

    def _try_prefill(self) -> ScheduledBatch | None:
        q = self.queues
        adder = self.admission.new_adder()
        chunked = q.chunked
        if chunked is not None and not adder.try_add(chunked, [], len(chunked.fill_ids) - chunked.computed):
            q.set_chunked(None)  # running requests grew into its room: it waits like the others
            self.retractor.retract(chunked)
        if q.chunked is None:
            self.admission.admit_waiting(adder)
        if not adder.admitted:
            return None
        q.set_chunked(adder.new_chunked)
        batch = ScheduledBatch(is_prefill=True)
        for req, extend in adder.admitted:
            ok = self.ledger.extend(req, extend)
            assert ok, "admission reserved this KV"
            batch.add(req, prefill_entry(req, extend), prefill=True)
        return batch

    def add_decodes(self, batch: ScheduledBatch) -> None:
        """Mixed chunk: every running request decodes one token in the prefill's forward, so a
        new prompt does not stall the running streams. Under KV pressure they wait for the next
        plain decode step, which retracts as needed."""
        if not self.ledger.decode_fits(self.queues.running):
            return
        self.ratio.decay()
        self.mixed_steps += 1
        for req in self.queues.running:
            ok = self.ledger.extend(req, 1)
            assert ok, "decode_fits() covers one token per running request"
            batch.add(req, decode_entry(req), prefill=False)

    def next_decode(self) -> ScheduledBatch | None:
        running = self.queues.running
        if not running:
            return None
        if not self.ledger.decode_fits(running):
            self.ledger.wait_for_tier_writes()  # before retracting anyone for KV a write holds
        self.retractor.retract_until_decode_fits()
        batch = ScheduledBatch(is_prefill=False)
        # Drafts only take KV left over once every running request has its one-token decode.
        spare = self.ledger.room() - decode_slots_needed(running, self.ledger.page_size)
        spec = self.speculator if self.speculator is not None and self.speculator.active(len(running)) else None
        for req in list(running):
            drafts = spec.drafts(req) if spec is not None else []
            if drafts:
                extra = self._draft_slots(req, drafts)
                drafts = drafts if extra <= spare else []
                spare -= extra if drafts else 0
            if not self.ledger.extend(req, 1 + len(drafts)):  # admission reserves decode KV: a bug
                logger.error("no KV slot for decoding request %s", req.rid)
                running.remove(req)
                self.lifecycle.finish_now(req, "out of KV cache memory")
                continue
            batch.add(req, speculative_entry(req, drafts) if drafts else decode_entry(req), prefill=False)
        return batch if batch.reqs else None

    def _draft_slots(self, req: Req, drafts: list[int]) -> int:
        """KV slots the drafts take beyond the plain one-token decode."""
        ps, kv = self.ledger.page_size, len(req.kv)
        return slots_to_extend(kv, 1 + len(drafts), ps) - slots_to_extend(kv, 1, ps)
