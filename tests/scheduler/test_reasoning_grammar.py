"""Grammars that start after the reasoning (`SamplingParams.grammar_after_ids`) over the fake
runner (tests/scheduler/fake_runner.py): no mask while the output has not reached the marker,
the grammar's masks from the token after it on, the marker split across steps (and across the
prefill and the first decode), a false start, overlap on and off, chunking, retraction, a
length finish while reasoning and aborts mid-reasoning, with the memory invariant checked after
every step. Pure Python: the fake grammar's mask is a set of allowed ids."""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import Future
from typing import Any

import pytest

from runtime.contracts.messages import AbortReq
from scheduler.grammar_queue import GrammarQueue
from scheduler.scheduler import Scheduler
from tests.scheduler.fake_runner import EOS, FakeRunner, hash_model, make_fake, masked_pick
from tests.scheduler.io_helpers import FakeIO, submit
from tests.scheduler.test_scheduler_parts import drive

MARK = [250, 251]  # the reasoning's end marker, two tokens (as "</think>" is for some tokenizers)
MARK_AT = 24  # the fake model writes MARK when its sequence is this long ...
FALSE_START_AT = 8  # ... and MARK[0] alone (not followed by MARK[1]) at this length
DIGITS = frozenset(range(100, 110))
ANSWER_LEN = 3  # the fake grammar: three digits, then EOS


def thinking_model(seq: Sequence[int]) -> int:
    """Free text that never writes the marker by chance, the marker at MARK_AT, a lone MARK[0]
    at FALSE_START_AT."""
    scripted = {FALSE_START_AT: MARK[0], MARK_AT: MARK[0], MARK_AT + 1: MARK[1]}
    if len(seq) in scripted and (len(seq) != MARK_AT + 1 or seq[-1] == MARK[0]):
        return scripted[len(seq)]
    token = hash_model(seq)
    return token - 100 if token in MARK else token


class DigitsThenEos:
    """A fake matcher: ANSWER_LEN digits, then EOS; it records every token it accepts."""

    def __init__(self) -> None:
        self.accepted: list[int] = []

    def next_mask(self) -> frozenset[int]:
        return DIGITS if len(self.accepted) < ANSWER_LEN else frozenset({EOS})

    def accept(self, token: int) -> bool:
        if token not in self.next_mask():
            return False
        self.accepted.append(token)
        return True

    def is_terminated(self) -> bool:
        return bool(self.accepted) and self.accepted[-1] == EOS


class FakeGrammars:
    """A grammar backend whose compiles are done at once; it keeps the states it made."""

    def __init__(self) -> None:
        self.states: list[DigitsThenEos] = []

    def submit(self, spec: Any) -> Future[Any]:
        future: Future[Any] = Future()
        future.set_result(spec)
        return future

    def new_state(self, compiled: Any) -> DigitsThenEos:
        self.states.append(DigitsThenEos())
        return self.states[-1]

    def forget(self, spec: Any) -> None:
        pass

    def reset(self) -> None:
        pass


def expected(prompt: list[int], n: int, marker: list[int] | None = MARK) -> tuple[list[int], int | None]:
    """(output, where the grammar starts) of greedy decoding without any scheduling."""
    seq, out, grammar, start = list(prompt), [], DigitsThenEos(), None if marker else 0
    for _ in range(n):
        token = thinking_model(seq)
        if start is not None:
            token = masked_pick(token, grammar.next_mask())
            assert grammar.accept(token)
        seq.append(token)
        out.append(token)
        if start is None and marker and out[-len(marker):] == marker:
            start = len(out)
        if grammar.is_terminated():
            break
    return out, start


def fake(**overrides: Any) -> tuple[Scheduler, FakeIO, FakeRunner, FakeGrammars]:
    backend = FakeGrammars()
    sched, io, runner = make_fake(model=thinking_model, grammars=GrammarQueue(lambda: backend), **overrides)  # type: ignore[arg-type, return-value]
    return sched, io, runner, backend


def ask(io: FakeIO, rid: str, prompt: list[int], n: int = 40, marker: list[int] | None = MARK) -> None:
    submit(io, rid, prompt, max_new_tokens=n, regex="[0-9]{3}", grammar_after_ids=marker)


PROMPT = [5, 6, 7, 8]  # output[4] is a lone MARK[0], output[20:22] the marker


@pytest.mark.parametrize("overlap", [False, True])
def test_no_mask_before_the_marker_and_the_grammars_masks_after_it(overlap: bool) -> None:
    sched, io, runner, backend = fake(disable_overlap_schedule=not overlap)
    ask(io, "a", PROMPT)
    result = drive(sched, io)["a"]
    out, start = expected(PROMPT, 40)
    assert start == MARK_AT - len(PROMPT) + 2 and out[4] == MARK[0] and out[start - 2:start] == MARK
    assert result["ids"] == out and len(out) == start + ANSWER_LEN + 1
    assert result["finish"] == {"type": "stop", "matched": EOS}
    masks = [e.token_bitmask for batch in runner.log for e in batch]  # entry k samples output[k]
    assert masks[:start] == [None] * start
    assert masks[start:] == [DIGITS] * ANSWER_LEN + [frozenset({EOS})]
    assert backend.states[0].accepted == out[start:]  # the matcher saw only what follows the marker


def test_the_marker_split_across_the_prefill_and_the_first_decode() -> None:
    sched, io, runner, backend = fake()
    prompt = list(range(20, 20 + MARK_AT))  # the prefill samples MARK[0], the first decode MARK[1]
    ask(io, "a", prompt)
    result = drive(sched, io)["a"]
    out, start = expected(prompt, 40)
    assert out[:2] == MARK and start == 2 and result["ids"] == out
    assert [e.token_bitmask is not None for batch in runner.log for e in batch] == [False, False] + [True] * 4
    assert backend.states[0].accepted == out[2:]


def test_without_a_marker_the_grammar_applies_from_the_first_token() -> None:
    sched, io, runner, backend = fake()
    ask(io, "a", PROMPT, marker=None)
    result = drive(sched, io)["a"]
    assert result["ids"] == expected(PROMPT, 40, marker=None)[0] and len(result["ids"]) == ANSWER_LEN + 1
    assert all(e.token_bitmask is not None for batch in runner.log for e in batch)


def test_max_new_tokens_while_reasoning_just_ends_with_length() -> None:
    sched, io, runner, backend = fake()
    ask(io, "a", PROMPT, n=21)  # the marker would end at the 22nd token
    result = drive(sched, io)["a"]
    assert result["ids"] == expected(PROMPT, 21)[0] and result["finish"] == {"type": "length", "length": 21}
    assert backend.states[0].accepted == []


WORK = [(f"r{i}", list(range(30 + i, 30 + i + 2 + i % 5)), 40) for i in range(8)]
CONFIGS = [dict(disable_overlap_schedule=not overlap, chunked_prefill_size=chunk, page_size=page)
           for overlap in (False, True) for chunk in (-1, 4) for page in (1, 4)]


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: "-".join(f"{v}" for v in c.values()))
def test_outputs_are_identical_in_every_configuration(config: dict[str, Any]) -> None:
    sched, io, _, _ = fake(**config)
    for rid, prompt, n in WORK:
        ask(io, rid, prompt, n)
    results = drive(sched, io)
    for rid, prompt, n in WORK:
        assert results[rid]["ids"] == expected(prompt, n)[0], rid


@pytest.mark.parametrize("overlap", [False, True])
def test_a_tight_pool_retracts_mid_reasoning_and_outputs_stay_identical(overlap: bool) -> None:
    sched, io, _, _ = fake(tokens=64, chunked_prefill_size=8, disable_overlap_schedule=not overlap)
    sched.ratio.value = 0.0  # reserve nothing for decode growth: the pool must retract
    retract, states = sched.retractor.retract, []

    def spy(req: Any) -> None:
        states.append(req.grammar_from)
        retract(req)

    sched.retractor.retract = spy  # type: ignore[method-assign]
    for rid, prompt, _ in WORK:
        ask(io, rid, prompt, 30)
    results = drive(sched, io)
    assert None in states  # a request was retracted while reasoning
    for rid, prompt, _ in WORK:
        assert results[rid]["ids"] == expected(prompt, 30)[0], rid


@pytest.mark.parametrize("overlap", [False, True])
def test_an_abort_mid_reasoning_frees_everything(overlap: bool) -> None:
    sched, io, _, backend = fake(disable_overlap_schedule=not overlap)
    for rid, prompt, n in WORK[:4]:
        ask(io, rid, prompt, n)
    for _ in range(3):  # every request is past its prefill, none past its marker
        sched.step()
        sched.check_integrity()
    live = [r for r in sched.queues.running if r.rid == "r1"]
    assert live and live[0].grammar is not None and live[0].active_grammar is None
    io.inbox.append(AbortReq("r1"))
    results = drive(sched, io)  # integrity after every step, and once idle
    assert results["r1"]["finish"]["type"] == "abort" and results["r1"]["finishes"] == 1
    for rid, prompt, n in WORK[:4]:
        if rid != "r1":
            assert results[rid]["ids"] == expected(prompt, n)[0], rid
    assert not sched.ledger.holding
