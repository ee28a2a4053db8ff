"""Drive the scheduler in-process (no sockets) on a tiny random-weight Llama: shared test helpers."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any

from runtime.config import ServerConfig
from runtime.messages import BatchTokenOut, GenerateReq
from runtime.model_setup import resolve_config
from runtime.sampling import SamplingParams
from scheduler.overlap import OverlapScheduler
from scheduler.process import build_scheduler

VOCAB = 300


class FakeIO:
    def __init__(self) -> None:
        self.inbox: list[Any] = []
        self.outs: list[BatchTokenOut] = []
        self.control: list[Any] = []

    def recv(self, block: bool) -> list[Any]:
        msgs, self.inbox = self.inbox, []
        return msgs

    def send_tokens(self, msg: BatchTokenOut) -> None:
        self.outs.append(msg)

    def send_control(self, msg: Any) -> None:
        self.control.append(msg)


def make(tiny_model: str, **overrides: Any):
    io = FakeIO()
    cfg = dict(model_path=tiny_model, device="cpu", dtype="float32", max_total_tokens=2048, max_running_requests=16,
               disable_overlap_schedule=True)
    cfg.update(overrides)
    return build_scheduler(resolve_config(ServerConfig(**cfg)), io), io


def submit(io: FakeIO, rid: str, prompt: list[int], **params: Any) -> None:
    extra = {k: params.pop(k) for k in ("return_logprob", "logprob_start_len", "top_logprobs_num", "stream", "deadline",
                                         "priority", "extra_key")
             if k in params}
    sp = SamplingParams(**{"temperature": 0.0, "ignore_eos": True, **params})
    io.inbox.append(GenerateReq(rid, prompt, sp, **extra))


def run_until_idle(sched, io: FakeIO, max_steps: int = 5000) -> dict[str, dict[str, Any]]:
    """Drive the scheduler's own loop (overlapped or not) until it is idle."""
    overlap = isinstance(sched, OverlapScheduler)
    with ThreadPoolExecutor(max_workers=1) as worker:
        pending = None
        for _ in range(max_steps):
            if overlap:
                pending = sched.overlap_step(worker, pending)
            else:
                sched.step()
            if sched.is_idle and not io.inbox and pending is None:
                break
        else:
            raise AssertionError("scheduler did not go idle")
    sched.check_idle_integrity()
    return collect(io)


def collect(io: FakeIO) -> dict[str, dict[str, Any]]:
    results: dict[str, dict[str, Any]] = {}
    for out in io.outs:
        for i, rid in enumerate(out.rids):
            r = results.setdefault(rid, {"ids": [], "finish": None, "finishes": 0, "input_logprobs": None})
            r["ids"] += out.new_ids[i]
            r["cached"] = out.cached_tokens[i]
            if out.input_logprobs[i] is not None:
                r["input_logprobs"] = out.input_logprobs[i]
            if out.finished_reasons[i] is not None:
                r["finish"] = out.finished_reasons[i]
                r["finishes"] += 1
    io.outs.clear()
    return results
