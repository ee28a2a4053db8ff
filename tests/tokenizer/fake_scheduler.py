"""A scheduler process double with the real one's contract, for runtime tests without a model.

`run_fake_scheduler(config, ipc_path, ready_conn)` binds "scheduler", pushes to "detokenizer"
and "tokenizer", reports ChildReady, and then per loop iteration (STEP_S apart) "generates" one
token for every running request: the prompt ids in reverse order, cycling. Everything real about
the protocol holds: one BatchTokenOut per step, one finished entry per request, aborts by rid
prefix, max_new_tokens=0 prefill-only requests, stop_token_ids (matched_stop_token), logprobs.

Test hooks:
  - the prompt CRASH_PROMPT raises inside the loop (SchedulerCrashed, exit code 1);
  - the prompt EXIT_PROMPT calls os._exit(EXIT_CODE) (a hard death without a report);
  (prompts, not rids: the scheduler only sees the rids the main process makes)
  - GetStateReq answers {"received": [[type, rid], ...], "running": [rids], "seeds": {rid: seed}}
    so a test can see exactly what reached the scheduler.
"""

from __future__ import annotations

import logging
import os
import sys
import time
import traceback
from dataclasses import dataclass, field, fields
from multiprocessing.connection import Connection
from typing import Any

from runtime.contracts.codec import TypeDispatcher, encode
from runtime.contracts.config import ServerConfig, read_model_json
from runtime.contracts.messages import (
    AbortReq,
    BatchTokenOut,
    ChildReady,
    FlushCacheOut,
    FlushCacheReq,
    GenerateReq,
    GetStateReq,
    SchedulerCrashed,
    ShutdownReq,
    StateOut,
)
from scheduler.process import SocketIO

logger = logging.getLogger("radixserve.fake_scheduler")
STEP_S = 0.01
EXIT_CODE = 7
OUTPUT_LOGPROB = -0.5
INPUT_LOGPROB = -1.0
CRASH_PROMPT = [7, 7, 7, 13]
EXIT_PROMPT = [7, 7, 7, 17]


@dataclass
class _Req:
    msg: GenerateReq
    output: list[int] = field(default_factory=list)
    sent: int = 0
    finish: dict[str, Any] | None = None
    matched_stop: bool = False
    first_sent: bool = False

    def next_token(self) -> int:
        rev = self.msg.input_ids[::-1]
        return rev[len(self.output) % len(rev)]


class FakeScheduler:
    """The loop: drain messages, one step for all running requests, one BatchTokenOut."""

    def __init__(self, ipc_path: str) -> None:
        self.io = SocketIO(ipc_path)  # the real scheduler's socket wiring
        self.running: dict[str, _Req] = {}
        self.received: list[list[str]] = []
        self.seeds: dict[str, int | None] = {}
        self.alive = True
        self.dispatch = TypeDispatcher({
            GenerateReq: self.on_generate, AbortReq: self.on_abort, FlushCacheReq: self.on_flush,
            GetStateReq: self.on_state, ShutdownReq: self.on_shutdown,
        })

    def run(self) -> None:
        while self.alive:
            msgs = self.io.recv(block=not self.running)
            for msg in msgs:
                self.received.append([type(msg).__name__, getattr(msg, "rid", "")])
                self.dispatch(msg)
            self.step()
            if self.running:
                time.sleep(STEP_S)

    def on_generate(self, msg: GenerateReq) -> None:
        if list(msg.input_ids) == CRASH_PROMPT:
            raise RuntimeError("fake scheduler: crash on demand")
        if list(msg.input_ids) == EXIT_PROMPT:
            os._exit(EXIT_CODE)
        self.seeds[msg.rid] = msg.sampling_params.seed
        self.running[msg.rid] = _Req(msg)

    def on_abort(self, msg: AbortReq) -> None:
        for req in self.running.values():
            if msg.matches(req.msg.rid) and req.finish is None:
                req.finish = {"type": "abort", "message": "Aborted by AbortReq."}

    def on_flush(self, msg: FlushCacheReq) -> None:
        self.io.send_control(FlushCacheOut(msg.req_id, success=not self.running))

    def on_state(self, msg: GetStateReq) -> None:
        state = {"received": self.received, "running": sorted(self.running), "seeds": self.seeds}
        self.io.send_control(StateOut(msg.req_id, state))

    def on_shutdown(self, _: ShutdownReq) -> None:
        self.alive = False

    def step(self) -> None:
        if not self.running:
            return
        for req in self.running.values():
            if req.finish is None:
                _advance(req)
        out = BatchTokenOut(**{f.name: [] for f in fields(BatchTokenOut)})
        for req in self.running.values():
            _append(out, req)
        self.running = {rid: r for rid, r in self.running.items() if r.finish is None}
        self.io.send_tokens(out)

    def close(self) -> None:
        self.io.close()


def _advance(req: _Req) -> None:
    sp = req.msg.sampling_params
    if len(req.output) >= sp.max_new_tokens:
        req.finish = {"type": "length", "length": sp.max_new_tokens}
        return
    token = req.next_token()
    req.output.append(token)
    if token in (sp.stop_token_ids or []):
        req.finish, req.matched_stop = {"type": "stop", "matched": token}, True
    elif len(req.output) >= sp.max_new_tokens:
        req.finish = {"type": "length", "length": sp.max_new_tokens}


def _append(out: BatchTokenOut, req: _Req) -> None:
    msg, first, new = req.msg, not req.first_sent, req.output[req.sent:]
    sp = msg.sampling_params
    out.rids.append(msg.rid)
    out.finished_reasons.append(req.finish)
    out.new_ids.append(new)
    out.decode_prefix.append(msg.input_ids[-5:] if first else None)
    out.prompt_tokens.append(len(msg.input_ids))
    out.completion_tokens.append(len(req.output))
    out.cached_tokens.append(0)
    out.skip_special_tokens.append(sp.skip_special_tokens)
    out.spaces_between_special_tokens.append(sp.spaces_between_special_tokens)
    out.stop_strs.append(sp.stop_strs)
    out.no_stop_trim.append(sp.no_stop_trim)
    out.matched_stop_token.append(req.matched_stop and req.finish is not None)
    lp = msg.return_logprob
    k = msg.top_logprobs_num
    out.output_logprobs.append([OUTPUT_LOGPROB] * len(new) if lp else None)
    tops = [[[t] * k, [OUTPUT_LOGPROB] * k] for t in new]
    out.output_top_logprobs.append(tops if lp and k else None)
    want_input = lp and first
    begin = msg.logprob_start_len if msg.logprob_start_len >= 0 else len(msg.input_ids)
    ids = msg.input_ids[begin:]
    out.input_ids_for_logprobs.append(ids if want_input else None)
    out.input_logprobs.append([None if begin + j == 0 else INPUT_LOGPROB for j in range(len(ids))]
                              if want_input else None)
    out.input_top_logprobs.append([None if begin + j == 0 else [[t] * k, [INPUT_LOGPROB] * k]
                                   for j, t in enumerate(ids)] if want_input and k else None)
    req.sent, req.first_sent = len(req.output), True


def scheduler_info(config: ServerConfig) -> dict[str, Any]:
    model_json = read_model_json(config.model_path or "", "config.json")
    gen_json = read_model_json(config.model_path or "", "generation_config.json")
    eos = gen_json.get("eos_token_id", model_json.get("eos_token_id"))
    return {
        "max_total_tokens": config.max_total_tokens,
        "max_running_requests": config.max_running_requests,
        "context_length": config.context_length,
        "vocab_size": model_json["vocab_size"],
        "eos_token_ids": eos if isinstance(eos, list) else [eos],
    }


def run_fake_scheduler(config: ServerConfig, ipc_path: str, ready_conn: Connection) -> None:
    """Entry point with `scheduler.process.run_scheduler_process`'s contract."""
    from runtime.support.procutil import configure_child, watch_parent

    configure_child(config, "fake-scheduler")
    watch_parent()
    sched = FakeScheduler(ipc_path)
    try:
        ready_conn.send_bytes(encode(ChildReady("scheduler", scheduler_info(config))))
        sched.run()
    except Exception:
        tb = traceback.format_exc()
        logger.error("fake scheduler crashed:\n%s", tb)
        sched.io.send_control(SchedulerCrashed("scheduler", tb))
        sched.close()
        sys.exit(1)
    sched.close()


def run_dying_scheduler(config: ServerConfig, ipc_path: str, ready_conn: Connection) -> None:
    """A scheduler that dies while 'loading' (for launch failure tests)."""
    os._exit(EXIT_CODE)


def orphan_leaf() -> None:
    """A child that only watches its parent (the parent-death test's grandchild)."""
    from runtime.support.procutil import watch_parent

    watch_parent()
    time.sleep(60)
    os._exit(0)


def orphan_middle(conn: Connection) -> None:
    """Spawn `orphan_leaf`, report its pid, then die without cleaning anything up."""
    import multiprocessing as mp

    leaf = mp.get_context("spawn").Process(target=orphan_leaf)
    leaf.start()
    conn.send(leaf.pid)
    time.sleep(0.5)  # let the leaf start its watch (it would also see the EOF later)
    os._exit(0)


def run_sleepy_scheduler(config: ServerConfig, ipc_path: str, ready_conn: Connection) -> None:
    """A scheduler that never gets ready (for the ready-timeout test)."""
    time.sleep(60)
