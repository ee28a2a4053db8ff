"""The scheduler: one thread owning every request, the prefix cache and the model runner.

It is made of parts, each owning its own state and given the parts it uses:

    ReqQueues        waiting, running, mid-chunk, grammar-compiling, finished-outside-a-forward
    KVLedger         request rows and KV held by requests; release, cache, integrity
    Lifecycle        live requests by rid and deadline; aborts, rejections, expiry
    Admission        prefill budgets; waiting requests into a prefill
    Retractor        retraction under KV pressure, preemption for urgent requests
    Batcher          the next batch: prefill (mixed or not), else decode (with drafts)
    ResultProcessor  sampled tokens into requests; requests onward
    Outbox           one BatchTokenOut per step
    Inbox            message handlers
    PlainLoop | OverlapLoop (over LoopParts)   the event loop
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from radix.allocator import KVAllocator
from radix.prefix_cache import make_prefix_cache
from runtime.contracts.config import ServerConfig
from scheduler import kv_events
from scheduler.admission import Admission
from scheduler.batch import ScheduledBatch
from scheduler.batch_log import BatchLog
from scheduler.batcher import Batcher
from scheduler.grammar_queue import GrammarQueue
from scheduler.inbox import Inbox
from scheduler.interfaces import Runner, SchedulerIO
from scheduler.kv_ledger import KVLedger
from scheduler.lifecycle import Lifecycle
from scheduler.loop import LoopParts, PlainLoop
from scheduler.output import Outbox
from scheduler.overlap import OverlapLoop
from scheduler.priority import PriorityRules
from scheduler.queues import ReqQueues
from scheduler.results import ResultProcessor
from scheduler.retract import NewTokenRatio
from scheduler.retractor import Retractor
from scheduler.speculative import Speculator
from scheduler.tier_setup import block_hasher, build_tier

__all__ = ["Scheduler", "SchedulerIO"]

logger = logging.getLogger(__name__)


class Scheduler:
    """Continuous batching with chunked prefill over a radix prefix cache."""

    def __init__(
        self,
        config: ServerConfig,
        runner: Runner,
        decode: Callable[[list[int], bool], str],
        eos_ids: frozenset[int],
        io: SchedulerIO,
        grammars: GrammarQueue | None = None,
        overlap: bool | None = None,
    ) -> None:
        """`overlap`: run the overlap loop; None: unless config.disable_overlap_schedule."""
        assert config.context_length is not None, "resolve_config() first"
        self.config = config
        self.runner = runner
        self.io = io
        self.eos_ids = eos_ids
        self.context_len = config.context_length
        ps = config.page_size
        hasher = block_hasher(config, runner)
        self.events = kv_events.from_config(config, config.device == "cuda") if hasher is not None else None
        cache = make_prefix_cache(KVAllocator(runner.kv_pool.num_slots, ps), ps, config.disable_radix_cache, hasher,
                                  self.events)
        self.queues = ReqQueues(grammars or GrammarQueue(None))
        pin_max = 0 if config.disable_radix_cache else int(cache.total * config.kv_pin_max_fraction)
        self.ledger = KVLedger(cache, runner.req_to_token, ps, pin_max)
        if config.kv_tier_bytes and hasher is not None:
            self.ledger.tier = build_tier(config, runner, cache, hasher)
        self.lifecycle = Lifecycle(self.queues, self.ledger)
        self.ratio = NewTokenRatio()
        priority = PriorityRules.from_config(config)  # None: priorities are not used
        self.speculator = Speculator.from_config(config)  # None: no speculative decoding
        self.admission = Admission(config, self.queues, self.ledger, self.ratio, priority)
        self.retractor = Retractor(self.queues, self.ledger, self.lifecycle, self.admission, self.ratio, priority)
        self.batcher = Batcher(config, self.queues, self.ledger, self.lifecycle, self.admission, self.retractor,
                               self.ratio, self.speculator)
        batch_log = BatchLog(logger, self.queues, cache)  # SGLang's per-batch lines, at debug level
        self.results = ResultProcessor(self.queues, self.ledger, self.speculator, decode, batch_log)
        self.outbox = Outbox(io, self.queues, self.lifecycle, config.stream_interval)
        self.inbox = Inbox(io, self.queues, self.ledger, self.lifecycle, eos_ids, self.context_len, self.state)
        self.parts = LoopParts(runner, self.inbox, self.lifecycle, self.ledger, self.batcher, self.results,
                               self.outbox, self.ratio, self.events)
        if overlap is None:
            overlap = not config.disable_overlap_schedule
        self.loop: PlainLoop | OverlapLoop = (
            OverlapLoop(self.parts, self.queues, self.retractor) if overlap else PlainLoop(self.parts)
        )

    # ------------------------------------------------------------------ driving it

    def event_loop(self) -> None:
        """Run until a ShutdownReq (the overlap loop also finishes the batch in flight)."""
        self.loop.run()

    def step(self) -> ScheduledBatch | None:
        """One loop iteration (tests drive the scheduler this way); returns the batch it ran or,
        under overlap, launched."""
        return self.loop.step()

    def dispatch(self, msg: Any) -> None:
        self.inbox.dispatch(msg)

    def close(self) -> None:
        """Stop the loop's forward thread, if it has one, and the KV tier's writer."""
        self.loop.close()
        if self.ledger.tier is not None:
            self.ledger.tier.close()
            self.ledger.tier = None
        if self.events is not None:
            self.events.close()
            self.events = self.parts.events = None

    @property
    def is_idle(self) -> bool:
        """No request anywhere (a batch may still be in flight: see `in_flight`)."""
        return self.lifecycle.idle

    @property
    def in_flight(self) -> ScheduledBatch | None:
        """The overlap loop's launched batch whose result is not processed yet."""
        return self.loop.in_flight

    @property
    def progress_at(self) -> float:
        """Monotonic time of the last loop iteration (the watchdog reads it)."""
        return self.parts.progress_at

    @property
    def max_running(self) -> int:
        return self.admission.max_running

    # ------------------------------------------------------------------ invariants

    def check_integrity(self) -> None:
        """The busy invariant, walking the whole KV pool and tree (tests; idle time)."""
        self.ledger.check_integrity()
        self.check_counts()
        self.lifecycle.check_integrity()

    def check_counts(self) -> None:
        """The busy invariant from counters only, in O(running requests): what a state poll
        checks. free + evictable + protected + held by requests == total, rows likewise."""
        self.ledger.check_counts()
        self.lifecycle.check_counts()

    def check_idle_integrity(self) -> None:
        self.parts.check_idle_integrity()

    def state(self) -> dict[str, Any]:
        """Answer a GetStateReq (/get_load polls it): counters only, never a walk of the pool."""
        try:
            self.check_counts()
            integrity = "ok"
        except AssertionError as exc:
            integrity = f"violated: {exc}"
        cache, rows = self.ledger.cache, self.ledger.rows
        return {
            "running": self.queues.num_running(),
            "waiting": self.queues.num_waiting(),
            "kv_total": cache.total,
            "kv_available": cache.available(),
            "kv_evictable": cache.evictable_size,
            "kv_protected": cache.protected_size,
            "rows_total": rows.size,
            "rows_free": rows.available(),
            "integrity": integrity,
            "retractions": self.retractor.retractions,
            "preemptions": self.retractor.preemptions,
            **(self.speculator or Speculator.off()).state(),
            "deadline_expired": self.lifecycle.deadline_expired,
            "evicted_tokens": cache.evicted_tokens,
            "mixed_steps": self.batcher.mixed_steps,
            **self.ledger.pins.state(),
            **(self.ledger.tier.state() if self.ledger.tier is not None else {}),
            "new_token_ratio": self.ratio.value,
            "busy_s": self.parts.busy_s,
            "forward_s": self.runner.forward_s,
            "forward_count": self.runner.forward_count,
        }
