"""SGLang's per-batch log lines, at debug level (`--log-level debug`), in SGLang's words so the
same log parsers work:

    Prefill batch. #new-seq: 2, #new-token: 310, #cached-token: 96, token usage: 0.01, #running-req: 3, #queue-req: 0
    Decode batch. #running-req: 5, #token: 1210, token usage: 0.02, gen throughput (token/s): 48.31, #queue-req: 1

A prefill line for every batch with prompt tokens, a decode line every DECODE_LOG_INTERVAL
decode steps (SGLang's default interval), its throughput over those steps.
"""

from __future__ import annotations

import logging
import time

from radix.prefix_cache import BasePrefixCache
from scheduler.batch import ScheduledBatch
from scheduler.queues import ReqQueues

DECODE_LOG_INTERVAL = 40


class BatchLog:
    def __init__(self, logger: logging.Logger, queues: ReqQueues, cache: BasePrefixCache) -> None:
        self.logger = logger
        self.queues = queues
        self.cache = cache
        self.decode_steps = 0
        self.decoded_tokens = 0
        self.since = time.monotonic()

    def record(self, batch: ScheduledBatch) -> None:
        """After `batch` ran (its requests' state updated)."""
        if not self.logger.isEnabledFor(logging.DEBUG):
            return
        cache, running = self.cache, self.queues.running
        usage = (cache.total - cache.available() - cache.evictable_size) / max(cache.total, 1)
        queued = self.queues.num_waiting()
        if batch.num_prefill:
            entries = batch.entries[: batch.num_prefill]
            new_tokens = sum(len(e.input_ids) for e in entries)
            # A request's cached prefix counts on its first chunk (the one that starts right after it).
            cached = sum(r.cached_tokens for r, e in zip(batch.reqs, entries) if e.prefix_len == r.cached_tokens)
            self.logger.debug(
                "Prefill batch. #new-seq: %d, #new-token: %d, #cached-token: %d, token usage: %.2f, "
                "#running-req: %d, #queue-req: %d",
                len(entries), new_tokens, cached, usage, len(running), queued)
        decodes = len(batch.reqs) - batch.num_prefill
        if not decodes:
            return
        self.decode_steps += 1
        self.decoded_tokens += decodes
        if self.decode_steps % DECODE_LOG_INTERVAL:
            return
        now = time.monotonic()
        throughput = self.decoded_tokens / max(now - self.since, 1e-9)
        self.since, self.decoded_tokens = now, 0
        tokens = sum(len(r.kv) for r in running)
        self.logger.debug(
            "Decode batch. #running-req: %d, #token: %d, token usage: %.2f, gen throughput (token/s): %.2f, "
            "#queue-req: %d", len(running), tokens, usage, throughput, queued)
