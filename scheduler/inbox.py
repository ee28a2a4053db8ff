"""The scheduler's message handlers, one per message type, and the way in for new requests:
validated on arrival, then queued (or held while their grammar compiles)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from runtime.contracts.codec import TypeDispatcher
from runtime.contracts.messages import (
    AbortReq,
    FlushCacheOut,
    FlushCacheReq,
    GenerateReq,
    GetStateReq,
    ShutdownReq,
    StateOut,
)
from scheduler.interfaces import SchedulerIO
from scheduler.kv_ledger import KVLedger
from scheduler.lifecycle import Lifecycle
from scheduler.queues import ReqQueues
from scheduler.request import Req
from scheduler.retract import pages

logger = logging.getLogger("scheduler.scheduler")
COMPILE_WAIT_S = 0.002  # the nap of a loop with only grammar compiles to wait for


class Inbox:
    """Handles every message to the scheduler (a `{type: handler}` table) and owns `stopped`."""

    def __init__(
        self,
        io: SchedulerIO,
        queues: ReqQueues,
        ledger: KVLedger,
        lifecycle: Lifecycle,
        eos_ids: frozenset[int],
        context_len: int,
        state: Callable[[], dict[str, Any]],
    ) -> None:
        self.io = io
        self.queues = queues
        self.ledger = ledger
        self.lifecycle = lifecycle
        self.eos_ids = eos_ids
        self.context_len = context_len
        self.state = state  # the whole scheduler's counters, for GetStateReq
        self.stopped = False  # a ShutdownReq arrived
        self.dispatch = TypeDispatcher({
            GenerateReq: self.handle_generate,
            AbortReq: self.handle_abort,
            FlushCacheReq: self.handle_flush,
            GetStateReq: self.handle_state,
            ShutdownReq: self.handle_shutdown,
        })

    def receive(self, block: bool) -> None:
        """Handle every message that arrived; with `block`, wait a little for the first."""
        for msg in self.io.recv(block=block):
            self.dispatch(msg)

    def admit_compiled_grammars(self) -> None:
        """Move requests whose grammar compiled to the waiting queue; reject failed ones."""
        q = self.queues
        ready, failed = q.grammars.poll()
        q.enqueue(ready)
        for req, error in failed:
            self.lifecycle.reject(req, error.message, error.param)
        if q.grammars.pending and not q.has_batchable:
            time.sleep(COMPILE_WAIT_S)  # only compiles are pending: do not spin on the socket

    def handle_generate(self, msg: GenerateReq) -> None:
        live = self.lifecycle.live.by_rid
        if msg.rid in live:
            # NOTE: the main process makes every rid, so this is a bug there; fail the request
            # that holds the rid (its finish tells the main process) and drop the copy, rather
            # than let two requests share one key here and in the detokenizer.
            logger.error("a second request with the live rid %s; aborting both", msg.rid)
            self.lifecycle.abort([live[msg.rid]], "a second request arrived with its rid")
            return
        req = Req.from_message(msg, self.eos_ids)
        problem = self._refusal(req)
        if problem is not None:
            self.lifecycle.reject(req, problem)
            return
        self.lifecycle.track(req)
        if not self.queues.grammars.submit(req):
            self.queues.enqueue([req])

    def _refusal(self, req: Req) -> str | None:
        """Why `req` can never run (None: it can). NOTE: the main process decides whether a
        request fits the context (tokenizer/limits.py) and sends only those that do; this is
        the scheduler's own guard, and it refuses rather than rewrite the client's max_new_tokens."""
        tokens = len(req.prompt) + req.sampling.max_new_tokens
        if not req.prompt or tokens > self.context_len:
            return (f"the prompt's {len(req.prompt)} tokens and max_new_tokens {req.sampling.max_new_tokens} "
                    f"exceed the context of {self.context_len}")
        need = pages(len(req.prompt) + req.sampling.max_new_tokens, self.ledger.page_size)
        total = self.ledger.cache.total
        if need > total:
            return f"the request needs {need} KV slots but the whole pool holds {total}"
        return None

    def handle_abort(self, msg: AbortReq) -> None:
        self.lifecycle.abort(self.lifecycle.live.matching(msg), "aborted by request")

    def handle_flush(self, msg: FlushCacheReq) -> None:
        if not self.lifecycle.idle:
            self.io.send_control(FlushCacheOut(msg.req_id, False, "requests are running"))
            return
        self.queues.grammars.reset()
        self.io.send_control(FlushCacheOut(msg.req_id, self.ledger.flush()))

    def handle_state(self, msg: GetStateReq) -> None:
        self.io.send_control(StateOut(msg.req_id, self.state()))

    def handle_shutdown(self, msg: ShutdownReq) -> None:
        self.stopped = True
