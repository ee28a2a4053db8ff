"""The scheduler: one thread owning every request, the prefix cache and the model runner.

Loop: drain incoming messages -> pick the next batch (prefill first, else decode everyone) ->
run it -> process its result -> send one BatchTokenOut; when idle, check the memory invariant.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable
from typing import Any, Protocol

from radix.allocator import KVAllocator
from radix.prefix_cache import make_prefix_cache
from runtime.contracts.codec import TypeDispatcher
from runtime.contracts.config import ServerConfig
from runtime.contracts.messages import (
    AbortReq,
    BatchTokenOut,
    FlushCacheOut,
    FlushCacheReq,
    GenerateReq,
    GetStateReq,
    ShutdownReq,
    StateOut,
)
from runtime.execution.model_runner import ForwardResult, ModelRunner
from scheduler.batch import ScheduledBatch, record_input_logprobs
from scheduler.batch_log import BatchLog
from scheduler.batching import BatchingMixin
from scheduler.deadlines import Deadlines
from scheduler.finish import check_finished
from scheduler.grammar_queue import GrammarQueue
from scheduler.output import build_batch_out, has_news
from scheduler.priority import PriorityRules
from scheduler.request import Req, ReqState
from scheduler.retract import NewTokenRatio, pages
from scheduler.rid_index import RidIndex
from scheduler.speculative import Speculator, trim_kv

logger = logging.getLogger(__name__)


class SchedulerIO(Protocol):
    def recv(self, block: bool) -> list[Any]: ...
    def send_tokens(self, msg: BatchTokenOut) -> None: ...
    def send_control(self, msg: Any) -> None: ...


class Scheduler(BatchingMixin):
    """Continuous batching with chunked prefill over a radix prefix cache."""

    def __init__(
        self,
        config: ServerConfig,
        runner: ModelRunner,
        decode: Callable[[list[int], bool], str],
        eos_ids: frozenset[int],
        io: SchedulerIO,
        grammars: GrammarQueue | None = None,
    ) -> None:
        self.config = config
        self.runner = runner
        self.decode = decode
        self.eos_ids = eos_ids
        self.io = io
        ps = config.page_size
        self.page_size = ps
        self.cache = make_prefix_cache(KVAllocator(runner.kv_pool.num_slots, ps), ps, config.disable_radix_cache)
        self.rows = runner.req_to_token
        assert config.context_length is not None, "resolve_config() first"
        self.context_len = config.context_length
        self.max_running = min(config.max_running_requests or self.rows.size, self.rows.size)
        chunk = config.chunked_prefill_size
        self.chunk_size = chunk if chunk and chunk > 0 else None
        self.waiting: list[Req] = []
        self.running: list[Req] = []
        self.chunked: Req | None = None  # the one request whose prompt is mid-way through chunks
        self.finished_out: list[Req] = []  # finished outside a forward (abort, rejection)
        self.grammars = grammars or GrammarQueue(None)
        self.deadlines = Deadlines()  # rids of live requests with a deadline (never the Req)
        self.deadline_expired = 0  # requests aborted because their deadline passed
        self.live: RidIndex[Req] = RidIndex()  # every request from arrival until its end is sent
        self.clock: Callable[[], float] = time.time  # the deadlines' clock (tests move it by hand)
        self.progress_at = time.monotonic()  # stamped by every loop iteration (the watchdog reads it)
        self.holding: dict[int, Req] = {}  # request row -> the request that holds it (and KV)
        self.stopped = False
        self.checked_idle = False
        self.busy_s = 0.0  # wall time of loop iterations that ran or finished a batch
        self.ratio = NewTokenRatio()
        self.retractions = 0
        self.priority = PriorityRules.from_config(config)  # None: priorities are not used
        self.preemptions = 0  # retractions for a more urgent request
        self.mixed_steps = 0  # forwards that ran a prefill and the running decodes together
        self.batch_log = BatchLog(logger)  # SGLang's per-batch lines, at debug level
        self.speculator = Speculator.from_config(config)  # None: no speculative decoding
        self.dispatch = TypeDispatcher({
            GenerateReq: self.handle_generate,
            AbortReq: self.handle_abort,
            FlushCacheReq: self.handle_flush,
            GetStateReq: self.handle_state,
            ShutdownReq: self.handle_shutdown,
        })

    # ------------------------------------------------------------------ loop

    def event_loop(self) -> None:
        while not self.stopped:
            self.step()

    def step(self) -> ScheduledBatch | None:
        for msg in self.io.recv(block=self.is_idle):
            self.dispatch(msg)
        start = time.perf_counter()
        self.admit_compiled_grammars()
        self.expire_overdue()
        batch = self.next_batch()
        if batch is not None:
            self.process_result(batch, self.runner.forward(batch.entries))
            self.checked_idle = False
        elif self.is_idle and not self.checked_idle:
            self.on_idle()
        self.send_outputs(batch)
        if batch is not None:
            self.busy_s += time.perf_counter() - start
        self.progress_at = time.monotonic()
        return batch

    def on_idle(self) -> None:
        self.check_idle_integrity()
        self.ratio.reset()
        self.checked_idle = True

    @property
    def is_idle(self) -> bool:
        # NOTE: `holding` also covers requests admitted into a prefill still in flight (overlap),
        # which are in no queue yet.
        return (
            not self.waiting and not self.running and self.chunked is None and not self.finished_out
            and not self.grammars.pending and not self.holding
        )

    def expire_overdue(self) -> None:
        """Abort the requests whose deadline passed, in whatever state they are."""
        rids = self.deadlines.pop_expired(self.clock())
        # NOTE: a request that finished this step is still live until its end is sent.
        expired = [r for r in map(self.live.by_rid.get, rids) if r is not None and not r.finished]
        self.deadline_expired += len(expired)
        self.abort_reqs(expired, "the request's deadline passed (its timeout)")

    def admit_compiled_grammars(self) -> None:
        """Move requests whose grammar compiled to the waiting queue; reject failed ones."""
        ready, failed = self.grammars.poll()
        self.waiting.extend(ready)
        for req, error in failed:
            self.reject(req, error.message, error.param)
        if self.grammars.pending and not self.waiting and not self.running and self.chunked is None:
            time.sleep(0.002)  # only compiles are pending: do not spin on the socket

    # ------------------------------------------------------------------ messages

    def handle_generate(self, msg: GenerateReq) -> None:
        if msg.rid in self.live.by_rid:
            # NOTE: the main process makes every rid, so this is a bug there; fail the request
            # that holds the rid (its finish tells the main process) and drop the copy, rather
            # than let two requests share one key here and in the detokenizer.
            logger.error("a second request with the live rid %s; aborting both", msg.rid)
            return self.abort_reqs([self.live.by_rid[msg.rid]], "a second request arrived with its rid")
        req = Req.from_message(msg, self.eos_ids)
        room = self.context_len - len(req.prompt)
        if not req.prompt or room < 0:
            return self.reject(req, f"the prompt has {len(req.prompt)} tokens; the context holds {self.context_len}")
        req.sampling.max_new_tokens = min(req.sampling.max_new_tokens, room)
        need = pages(len(req.prompt) + req.sampling.max_new_tokens, self.page_size)
        if need > self.cache.total:
            return self.reject(req, f"the request needs {need} KV slots but the whole pool holds {self.cache.total}")
        self.live.add(req)
        self.deadlines.add(req)
        if not self.grammars.submit(req):
            self.waiting.append(req)

    def handle_abort(self, msg: AbortReq) -> None:
        self.abort_reqs(self.live.matching(msg), "aborted by request")

    def abort_reqs(self, reqs: list[Req], message: str) -> None:
        """Abort these requests wherever they are: the grammar queue, waiting, mid-chunk,
        running, or admitted into a prefill still in flight (overlap: in no queue yet)."""
        for req in reqs:
            if req.finished:
                continue
            if req is self.chunked:
                self.chunked = None
            for queue in (self.grammars.pending, self.waiting, self.running):
                with contextlib.suppress(ValueError):  # an identity scan in C; not in this one
                    queue.remove(req)
            self.finish_now(req, message)

    def handle_flush(self, msg: FlushCacheReq) -> None:
        if not self.is_idle:
            self.io.send_control(FlushCacheOut(msg.req_id, False, "requests are running"))
            return
        self.grammars.reset()
        self.io.send_control(FlushCacheOut(msg.req_id, self.cache.flush()))

    def handle_state(self, msg: GetStateReq) -> None:
        self.io.send_control(StateOut(msg.req_id, self.state()))

    def handle_shutdown(self, msg: ShutdownReq) -> None:
        self.stopped = True

    def reject(self, req: Req, message: str, param: str | None = None) -> None:
        """Refuse a request before it ran; with `param`, the client gets a 400 naming it."""
        req.abort(message, param)
        self.finished_out.append(req)

    def finish_now(self, req: Req, message: str) -> None:
        """Abort a request between steps: free exactly what it holds, report it once."""
        req.abort(message)
        self.release(req)
        self.finished_out.append(req)

    # ------------------------------------------------------------------ results

    def process_result(self, batch: ScheduledBatch, result: ForwardResult) -> None:
        next_ids = result.host_next_ids()  # the step's one wait for the device
        logprobs = result.host_logprobs()
        for i, req in enumerate(batch.reqs):
            if req.finished:  # aborted meanwhile, or (overlap) finished by the previous step
                continue
            prefill = batch.is_prefill_entry(i)
            if prefill:
                record_input_logprobs(req, batch.entries[i], result, i)
                if req.computed < len(req.fill_ids):  # a middle chunk: publish it, keep going
                    self.cache_unfinished(req)
                    continue
                if req.sampling.max_new_tokens == 0:  # prefill-only (scoring, cache warm-up)
                    req.finish({"type": "length", "length": 0})
                    self.release(req)
                    continue
            drafts = batch.entries[i].draft_ids
            if drafts and result.accepted is not None:
                self.append_speculated(req, drafts, result.accepted[i], next_ids[i], result, i)
            else:
                self.append_token(req, next_ids[i], result, i, logprobs)
            if req.finished:
                if not prefill:
                    self.running.remove(req)
                self.release(req)
            elif prefill:
                self.cache_unfinished(req)
                req.state = ReqState.RUNNING
                self.running.append(req)
        self.batch_log.record(self, batch)

    def append_token(self, req: Req, token: int, result: ForwardResult, i: int, logprobs: list[float] | None) -> None:
        req.output.append(token)
        if req.grammar is not None and not req.grammar.accept(token):
            req.abort(f"the grammar rejected token {token}")
        if req.return_logprob and logprobs is not None:
            req.output_logprobs.append(logprobs[i])
            if req.top_logprobs_num and result.top_logprobs is not None:
                ids, vals = result.top_logprobs[i]
                req.output_top_logprobs.append([list(ids), list(vals)])
        check_finished(req, self.decode)
        if not req.finished and req.grammar is not None and req.grammar.is_terminated():
            req.matched_stop_token = token in req.stop_ids
            req.finish({"type": "stop", "matched": token})

    def append_speculated(self, req: Req, drafts: list[int], accepted: list[int], after: int,
                          result: ForwardResult, i: int) -> None:
        """The accepted drafts and the token after them, while the request runs; then its KV
        keeps the positions computed for tokens it kept (scheduler/speculative.py)."""
        assert self.speculator is not None
        start = len(req.fill_ids)  # the verify step computed positions start - 1 .. start - 1 + k
        appended = 0
        for token in [*accepted, after]:
            self.append_token(req, token, result, i, None)
            appended += 1
            if req.finished:
                break
        trim_kv(self.cache, req, start + min(len(accepted), appended), self.page_size)
        self.speculator.record(len(drafts), len(accepted))

    def cache_unfinished(self, req: Req) -> None:
        """Publish a continuing request's computed tokens to the cache; re-point its row."""
        assert req.node is not None
        update = self.cache.cache_unfinished(
            req.fill_ids[: req.computed], req.kv, req.prefix_len, req.node, req.extra_key
        )
        req.kv, req.prefix_len, req.node = list(update.kv), update.prefix_len, update.node
        req.row_synced = 0  # canonical slots may differ from what the row holds

    def release(self, req: Req) -> None:
        """Hand a finished request's KV to the cache and free its row (idempotent).

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
        self.cache.cache_finished(tokens, kv, req.prefix_len, req.node, req.extra_key)
        del self.holding[req.row]
        self.rows.free(req.row)
        req.row, req.kv, req.prefix_len, req.node = None, [], 0, None

    def send_outputs(self, batch: ScheduledBatch | None) -> None:
        candidates = dict.fromkeys([*self.finished_out, *(batch.reqs if batch else [])])
        reqs = [r for r in candidates if has_news(r, self.config.stream_interval)]
        self.finished_out = []
        for req in reqs:
            if req.finished:
                self.forget(req)
        if reqs:
            self.io.send_tokens(build_batch_out(reqs))

    def forget(self, req: Req) -> None:
        """A finished request's end is sent: drop it from the rid index and the deadlines, the
        last scheduler structures that referred to it."""
        if self.live.by_rid.get(req.rid) is req:  # not a later request that reused its rid
            self.deadlines.remove(req.rid)
        self.live.remove(req)

    # ------------------------------------------------------------------ invariants

    def check_integrity(self) -> None:
        """The busy invariant, walking the whole KV pool and tree (tests; idle time)."""
        self.cache.check_integrity(held_by_requests=self.held_slots())
        self.rows.check_integrity()
        self.check_counts()
        self.live.check_integrity()
        self.deadlines.check_integrity()

    def check_counts(self) -> None:
        """The busy invariant from counters only, in O(running requests): what a state poll
        checks. free + evictable + protected + held by requests == total, rows likewise."""
        self.cache.check_counts(held_by_requests=self.held_slots())
        assert self.rows.available() == self.rows.size - len(self.holding), "request rows leaked"
        assert len(self.deadlines) <= len(self.live), "deadlines of requests no longer live"

    def held_slots(self) -> int:
        return sum(self.cache.owned_slots(r.computed, r.prefix_len) for r in self.holding.values())

    def check_idle_integrity(self) -> None:
        assert not self.live, f"idle but {len(self.live)} requests are still indexed"
        assert not self.deadlines, f"idle but {len(self.deadlines)} deadlines are still tracked"
        self.cache.check_idle_integrity()
        self.rows.check_integrity()
        assert self.rows.available() == self.rows.size, (
            f"request rows leaked: {self.rows.size - self.rows.available()} held while idle"
        )

    def state(self) -> dict[str, Any]:
        """Answer a GetStateReq (/get_load polls it): counters only, never a walk of the pool."""
        try:
            self.check_counts()
            integrity = "ok"
        except AssertionError as exc:
            integrity = f"violated: {exc}"
        return {
            "running": len(self.running) + (self.chunked is not None),
            "waiting": len(self.waiting) + len(self.grammars.pending),
            "kv_total": self.cache.total,
            "kv_available": self.cache.available(),
            "kv_evictable": self.cache.evictable_size,
            "kv_protected": self.cache.protected_size,
            "rows_total": self.rows.size,
            "rows_free": self.rows.available(),
            "integrity": integrity,
            "retractions": self.retractions,
            "preemptions": self.preemptions,
            **(self.speculator or Speculator.off()).state(),
            "deadline_expired": self.deadline_expired,
            "evicted_tokens": self.cache.evicted_tokens,
            "mixed_steps": self.mixed_steps,
            "new_token_ratio": self.ratio.value,
            "busy_s": self.busy_s,
            "forward_s": self.runner.forward_s,
            "forward_count": self.runner.forward_count,
        }
