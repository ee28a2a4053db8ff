"""`pinned_tokens` from the scheduler to the usage event: the detokenizer passes it through, the
request state keeps it (an older sender's message without it reads as 0), and the core's `Usage`
carries it; the GenerateReq carries a prompt's pin. No model: a stub tokenizer and hand-made
messages."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import fields
from typing import Any

from detokenizer.manager import DetokenizerManager
from runtime.contracts.codec import decode, encode
from runtime.contracts.messages import BatchStrOut, BatchTokenOut, GenerateReq
from runtime.contracts.sampling import SamplingParams
from tokenizer.core.events import Tokens, Usage
from tokenizer.core.pipeline import common_prefix, read_updates
from tokenizer.core.request import CachePin, GenRequest, PromptRequest
from tokenizer.manager import Taken
from tokenizer.request_state import Group, ReqState, StateDelta, apply_output, take_delta


class Letters:
    """A tokenizer double: id i decodes to chr(97 + i)."""

    def decode(self, ids: list[int], **kwargs: Any) -> str:
        return "".join(chr(97 + i) for i in ids)

    def batch_decode(self, seqs: list[list[int]], **kwargs: Any) -> list[str]:
        return [self.decode(s) for s in seqs]

    def convert_ids_to_tokens(self, ids: list[int]) -> list[str]:
        return [chr(97 + i) for i in ids]


def _token_out(pinned: list[int]) -> BatchTokenOut:
    out = BatchTokenOut(**{f.name: [] for f in fields(BatchTokenOut) if f.name not in ("queue_times", "pinned_tokens")})
    for rid in ("a", "b"):
        out.rids.append(rid)
        out.finished_reasons.append({"type": "length"})
        out.new_ids.append([1])
        out.decode_prefix.append(None)
        out.prompt_tokens.append(10)
        out.completion_tokens.append(1)
        out.cached_tokens.append(3)
        out.skip_special_tokens.append(True)
        out.spaces_between_special_tokens.append(True)
        out.stop_strs.append([])
        out.no_stop_trim.append(False)
        out.matched_stop_token.append(False)
        for name in ("output_logprobs", "output_top_logprobs", "input_logprobs", "input_top_logprobs",
                     "input_ids_for_logprobs"):
            getattr(out, name).append(None)
    out.pinned_tokens = pinned
    return out


def test_the_detokenizer_passes_pinned_tokens_through() -> None:
    manager = DetokenizerManager(Letters())  # type: ignore[arg-type]
    assert manager.handle_batch(_token_out([5, 0])).pinned_tokens == [5, 0]
    assert manager.handle_batch(_token_out([])).pinned_tokens == []  # an older scheduler's message
    out = manager.handle_batch(_token_out([7, 7]))
    assert decode(encode(out)) == out


def _state() -> ReqState:
    return ReqState.for_request(GenerateReq("r", list(range(10)), SamplingParams()), Group(), False)


def _str_out(pinned: list[int]) -> BatchStrOut:
    return BatchStrOut(["r"], [None], ["x"], [[1]], [10], [1], [3], [None], [None], [None], [None], [None],
                       pinned_tokens=pinned)


def test_the_state_keeps_the_latest_count_and_an_old_sender_leaves_it() -> None:
    state = _state()
    apply_output(state, _str_out([]), 0, 0.0, lambda ids: [None] * len(ids))
    assert state.pinned_tokens == 0 and take_delta(state).pinned_tokens == 0
    apply_output(state, _str_out([6]), 0, 0.0, lambda ids: [None] * len(ids))
    apply_output(state, _str_out([]), 0, 0.0, lambda ids: [None] * len(ids))  # a message without the field
    delta = take_delta(state)
    assert (state.pinned_tokens, delta.pinned_tokens, delta.cached_tokens) == (6, 6, 3)


def test_the_usage_event_carries_pinned_tokens() -> None:
    async def taken() -> AsyncIterator[Taken]:
        yield 0, StateDelta("hi", [1], None, None, None, 10, 1, 3, {"type": "length"}, "r", 0.0, 4)

    async def events() -> list[Any]:
        req = GenRequest([PromptRequest([1, 2], "r", {})])
        return [e for u in [u async for u in read_updates(req, taken())] for e in u.events]

    tokens = [e for e in asyncio.run(events()) if isinstance(e, Tokens)]
    assert tokens[0].usage == Usage(10, 1, 3, 4)
    assert Usage(10, 1, 3).pinned_tokens == 0  # senders without pins


def test_a_pin_becomes_the_generate_reqs_fields() -> None:
    assert CachePin(300.0, 12).fields(40) == (12, 300.0)
    assert CachePin(3600.0, 99).fields(40) == (40, 3600.0)  # never past the prompt
    assert CachePin(300.0, 0).fields(40) == (0, 0.0)  # nothing in common: no pin at all
    assert (GenerateReq("r", [1], SamplingParams()).pin_prefix_len, GenerateReq("r", [1], SamplingParams()).pin_ttl_s) \
        == (0, 0.0)


def test_common_prefix_compares_in_steps_and_stops_at_the_first_difference() -> None:
    a = list(range(5000))
    assert common_prefix(a, a) == 5000
    assert common_prefix(a, a[:3000]) == 3000
    assert common_prefix(a, [*a[:4321], -1, *a[4322:]], step=1024) == 4321
    assert common_prefix([], a) == 0 and common_prefix([1], [2]) == 0
