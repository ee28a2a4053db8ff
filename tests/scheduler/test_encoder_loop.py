"""The encoder's scheduler with a fake model: batches by padded tokens, aborts, refusals."""

from __future__ import annotations

from typing import Any

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
from runtime.contracts.sampling import SamplingParams
from scheduler.encoder_loop import EncoderScheduler


class FakeEncoder:
    """Each input's vector is [its length, its first id]; records each batch."""

    def __init__(self) -> None:
        self.batches: list[list[list[int]]] = []

    @property
    def forward_count(self) -> int:
        return len(self.batches)

    def embed(self, batch: list[list[int]]) -> list[list[float]]:
        self.batches.append(batch)
        return [[float(len(ids)), float(ids[0])] for ids in batch]


class ListIO:
    def __init__(self, inbox: list[list[Any]]) -> None:
        self.inbox = inbox
        self.tokens: list[BatchTokenOut] = []
        self.control: list[Any] = []

    def recv(self, block: bool) -> list[Any]:
        """The next message list; once empty, a blocking receive (the loop is idle) stops it."""
        if self.inbox:
            return self.inbox.pop(0)
        return [ShutdownReq()] if block else []

    def send_tokens(self, msg: BatchTokenOut) -> None:
        self.tokens.append(msg)

    def send_control(self, msg: Any) -> None:
        self.control.append(msg)


def _embed(rid: str, ids: list[int], embed: bool = True) -> GenerateReq:
    return GenerateReq(rid, ids, SamplingParams(max_new_tokens=0 if embed else 4), embed=embed)


def _finished(io: ListIO) -> dict[str, tuple[dict[str, Any] | None, list[float] | None]]:
    return {rid: (reason, vec) for out in io.tokens
            for rid, reason, vec in zip(out.rids, out.finished_reasons, out.embeddings)}


def test_waiting_inputs_run_in_batches_within_the_padded_token_budget() -> None:
    runner = FakeEncoder()
    io = ListIO([[_embed("a", [1] * 3), _embed("b", [2] * 3), _embed("c", [3] * 6), _embed("d", [4])]])
    EncoderScheduler(runner, io, context_len=16, max_batch_tokens=8).event_loop()
    assert [len(b) for b in runner.batches] == [2, 1, 1]  # a+b (2x3); c (6) alone: 3x6 > 8; then d
    done = _finished(io)
    assert done["c"] == ({"type": "length", "length": 0}, [6.0, 3.0])
    assert set(done) == {"a", "b", "c", "d"}
    out = io.tokens[0]
    assert all(len(getattr(out, name)) == len(out.rids) for name in BatchTokenOut.__dataclass_fields__)


def test_non_embed_and_over_long_requests_are_refused_naming_the_field() -> None:
    runner = FakeEncoder()
    io = ListIO([[_embed("gen", [1, 2], embed=False), _embed("long", [1] * 17), _embed("empty", [])]])
    EncoderScheduler(runner, io, context_len=16).event_loop()
    done = _finished(io)
    assert done["gen"][0] is not None and done["gen"][0]["param"] == "model"
    assert done["long"][0] is not None and done["long"][0]["param"] == "input"
    assert done["empty"][0] is not None and done["empty"][0]["type"] == "abort"
    assert not runner.batches


def test_abort_takes_a_waiting_request_and_its_fan_out_and_control_is_answered() -> None:
    runner = FakeEncoder()
    io = ListIO([[_embed("job_0", [1]), _embed("job_1", [2]), _embed("other", [3]), AbortReq("job"),
                  FlushCacheReq(1), GetStateReq(2)]])
    EncoderScheduler(runner, io, context_len=16).event_loop()
    done = _finished(io)
    assert done["job_0"][0] == {"type": "abort", "message": "aborted by request"} and done["job_0"][1] is None
    assert done["other"][1] == [1.0, 3.0]
    flush, state = io.control
    assert isinstance(flush, FlushCacheOut) and flush.success
    assert isinstance(state, StateOut) and state.state["waiting"] == 1 and state.state["encoder"]
