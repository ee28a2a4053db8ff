"""The scheduler of an encoder (BERT): embed requests in, one forward per batch, vectors out.

An encoder has no KV cache and no decode steps, so none of the decoder scheduler's parts apply:
the loop takes what arrived, runs the waiting inputs in batches of at most `max_batch_tokens`
padded tokens (at least one input each), and reports each request finished with its vector in
the step's one `BatchTokenOut`. One thread, as the decoder's scheduler; nothing here loads torch
(the runner is given).

The main process refuses anything but embed requests for an encoder (tokenizer/limits.py
`check_task`) and checks each input against the context; this loop still refuses, by an abort
naming the field, what it cannot run, rather than trusting that.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from dataclasses import dataclass, fields
from typing import Any, Protocol

from runtime.contracts.codec import TypeDispatcher
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
from scheduler.interfaces import SchedulerIO

logger = logging.getLogger("radixserve.scheduler")
DEFAULT_BATCH_TOKENS = 8192  # padded tokens per forward (batch size x the longest input)


class EncoderModel(Protocol):
    """What the loop needs of `runtime.execution.encoder_runner.EncoderRunner`."""

    @property
    def forward_count(self) -> int: ...
    def embed(self, batch: list[list[int]]) -> list[list[float]]: ...


@dataclass(slots=True)
class _Done:
    """One request's end, as it goes out."""

    msg: GenerateReq
    reason: dict[str, Any]
    vector: list[float] | None = None
    queued_s: float | None = None


class EncoderScheduler:
    def __init__(self, runner: EncoderModel, io: SchedulerIO, context_len: int,
                 max_batch_tokens: int = DEFAULT_BATCH_TOKENS) -> None:
        self.runner = runner
        self.io = io
        self.context_len = context_len
        self.max_batch_tokens = max_batch_tokens
        self.waiting: deque[tuple[GenerateReq, float]] = deque()
        self.stopped = False
        self.forward_s = 0.0
        self._dispatch = TypeDispatcher({
            GenerateReq: self.handle_generate, AbortReq: self.handle_abort, FlushCacheReq: self.handle_flush,
            GetStateReq: self.handle_state, ShutdownReq: self.handle_shutdown,
        })

    def event_loop(self) -> None:
        while not self.stopped:
            for msg in self.io.recv(block=not self.waiting):
                self._dispatch(msg)
            if self.waiting and not self.stopped:
                self.step()

    def step(self) -> None:
        """Embed the next batch of waiting requests and report them."""
        batch = self._take_batch()
        start = time.perf_counter()
        vectors = self.runner.embed([msg.input_ids for msg, _ in batch])
        self.forward_s += time.perf_counter() - start
        now = time.monotonic()
        done = [_Done(msg, {"type": "length", "length": 0}, vec, now - t) for (msg, t), vec in zip(batch, vectors)]
        self._send(done)

    def _take_batch(self) -> list[tuple[GenerateReq, float]]:
        batch = [self.waiting.popleft()]
        width = len(batch[0][0].input_ids)
        while self.waiting:
            longest = max(width, len(self.waiting[0][0].input_ids))
            if longest * (len(batch) + 1) > self.max_batch_tokens:
                break
            batch.append(self.waiting.popleft())
            width = longest
        return batch

    def handle_generate(self, msg: GenerateReq) -> None:
        problem = None
        if not msg.embed or msg.sampling_params.max_new_tokens:
            problem = ("this model is an encoder: it only embeds", "model")
        elif not msg.input_ids or len(msg.input_ids) > self.context_len:
            problem = (f"the input's {len(msg.input_ids)} tokens exceed the context of {self.context_len}", "input")
        if problem is not None:
            self._send([_Done(msg, {"type": "abort", "message": problem[0], "param": problem[1]})])
            return
        self.waiting.append((msg, time.monotonic()))

    def handle_abort(self, msg: AbortReq) -> None:
        gone = [item for item in self.waiting if msg.matches(item[0].rid)]
        for item in gone:
            self.waiting.remove(item)
        self._send([_Done(m, {"type": "abort", "message": "aborted by request"}) for m, _ in gone])

    def handle_flush(self, msg: FlushCacheReq) -> None:
        self.io.send_control(FlushCacheOut(msg.req_id, True, "an encoder keeps no cache"))

    def handle_state(self, msg: GetStateReq) -> None:
        self.io.send_control(StateOut(msg.req_id, self.state()))

    def handle_shutdown(self, msg: ShutdownReq) -> None:
        self.stopped = True

    def state(self) -> dict[str, Any]:
        return {"running": 0, "waiting": len(self.waiting), "kv_total": 0, "kv_available": 0, "kv_evictable": 0,
                "kv_protected": 0, "integrity": "ok", "encoder": True, "forward_s": self.forward_s,
                "forward_count": self.runner.forward_count}

    def _send(self, done: list[_Done]) -> None:
        if not done:
            return
        out = BatchTokenOut(**{f.name: [] for f in fields(BatchTokenOut)})
        for d in done:
            n = len(d.msg.input_ids)
            for name, value in (("rids", d.msg.rid), ("finished_reasons", d.reason), ("new_ids", []),
                                ("decode_prefix", []), ("prompt_tokens", n), ("completion_tokens", 0),
                                ("cached_tokens", 0), ("skip_special_tokens", True),
                                ("spaces_between_special_tokens", True), ("stop_strs", []), ("no_stop_trim", False),
                                ("matched_stop_token", False), ("output_logprobs", None),
                                ("output_top_logprobs", None), ("input_logprobs", None), ("input_top_logprobs", None),
                                ("input_ids_for_logprobs", None), ("queue_times", d.queued_s),
                                ("pinned_tokens", 0), ("embeddings", d.vector)):
                getattr(out, name).append(value)
        self.io.send_tokens(out)
