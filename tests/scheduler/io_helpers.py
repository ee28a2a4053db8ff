"""Talking to an in-process scheduler: an in-memory SchedulerIO, a request builder and a
collector of its outputs. Pure Python (shared by the real-model and the fake-runner tests)."""

from __future__ import annotations

from typing import Any

from runtime.contracts.messages import BatchTokenOut, GenerateReq
from runtime.contracts.sampling import SamplingParams


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


def submit(io: FakeIO, rid: str, prompt: list[int], **params: Any) -> None:
    """Queue a greedy GenerateReq (EOS ignored unless `ignore_eos=False` is passed)."""
    extra = {k: params.pop(k) for k in ("return_logprob", "logprob_start_len", "top_logprobs_num", "stream", "deadline",
                                         "priority", "extra_key", "pin_prefix_len", "pin_ttl_s")
             if k in params}
    sp = SamplingParams(**{"temperature": 0.0, "ignore_eos": True, **params})
    io.inbox.append(GenerateReq(rid, prompt, sp, **extra))


def collect(io: FakeIO) -> dict[str, dict[str, Any]]:
    """Each rid's tokens, finish and number of finish reports in `io.outs` (which it empties)."""
    results: dict[str, dict[str, Any]] = {}
    for out in io.outs:
        for i, rid in enumerate(out.rids):
            r = results.setdefault(rid, {"ids": [], "finish": None, "finishes": 0, "input_logprobs": None})
            r["ids"] += out.new_ids[i]
            r["cached"] = out.cached_tokens[i]
            r["pinned"] = out.pinned_tokens[i] if out.pinned_tokens else 0
            if out.input_logprobs[i] is not None:
                r["input_logprobs"] = out.input_logprobs[i]
            if out.finished_reasons[i] is not None:
                r["finish"] = out.finished_reasons[i]
                r["finishes"] += 1
    io.outs.clear()
    return results
