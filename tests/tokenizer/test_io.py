"""Tests for tokenizer/native/generate.py (/generate bodies parsed into the typed request, answers
folded from the event stream) and tokenizer/request_state.py (logprob shapes, per-request state,
what a consumer takes)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

from runtime.contracts.errors import InvalidRequest
from runtime.contracts.messages import BatchStrOut, GenerateReq
from runtime.contracts.sampling import SamplingParams
from tokenizer.core.pipeline import read_updates
from tokenizer.core.request import GenRequest, Logprobs, PromptRequest
from tokenizer.manager import Taken
from tokenizer.native.generate import NativeAnswer, parse_generate
from tokenizer.request_state import (
    Group,
    ReqState,
    StateDelta,
    apply_output,
    take_delta,
    token_logprobs,
    top_logprobs,
)


def test_single_text_defaults() -> None:
    req = parse_generate({"text": "hi", "unknown_field": {"ignored": 1}})
    assert not req.batch and len(req.prompts) == 1
    r = req.prompts[0]
    assert r.prompt == "hi" and r.field == "text"
    assert len(r.rid) == 32 and r.sampling == {}
    assert r.logprobs == Logprobs(enabled=False, start_len=-1, top_n=0, with_text=False)
    assert not req.stream and req.group_rid is None and req.cache_namespace is None


def test_batch_text_with_string_rid_and_shared_params() -> None:
    params = {"max_new_tokens": 3}
    req = parse_generate({"text": ["a", "b"], "rid": "x", "sampling_params": params, "stream": True})
    assert req.batch and [r.rid for r in req.prompts] == ["x_0", "x_1"] and req.group_rid == "x"
    assert all(r.sampling == params for r in req.prompts) and req.stream
    req.prompts[0].sampling["max_new_tokens"] = 9  # each prompt owns a copy
    assert req.prompts[1].sampling == params


def test_input_ids_single_and_batch_with_per_item_fields() -> None:
    req = parse_generate({"input_ids": [1, 2, 3], "rid": "r"})
    assert not req.batch and req.prompts[0].prompt == [1, 2, 3] and req.prompts[0].rid == "r"
    assert req.prompts[0].field == "input_ids" and req.group_rid is None
    body = {"input_ids": [[1], [2, 3]], "rid": ["p", "q"], "return_logprob": [True, False],
            "logprob_start_len": [0, -1], "top_logprobs_num": 2,
            "sampling_params": [{"n": 1}, {"n": 2}], "return_text_in_logprobs": True}
    req = parse_generate(body)
    assert req.batch and [r.prompt for r in req.prompts] == [[1], [2, 3]]
    assert [(r.rid, r.logprobs.enabled, r.logprobs.start_len, r.logprobs.top_n) for r in req.prompts] == [
        ("p", True, 0, 2), ("q", False, -1, 2)]
    assert [r.sampling for r in req.prompts] == [{"n": 1}, {"n": 2}]
    assert all(r.logprobs.with_text for r in req.prompts)
    assert req.group_rid is None  # a list of rids names each prompt, not the batch


def test_sampling_params_are_samplingparams_fields() -> None:
    req = parse_generate({"text": "a", "sampling_params": {"sampling_seed": 7, "temperature": 0.0, "stop": None}})
    assert req.prompts[0].sampling == {"seed": 7, "temperature": 0.0}  # None: the default
    with pytest.raises(InvalidRequest) as info:
        parse_generate({"text": "a", "sampling_params": {"seed": 1, "sampling_seed": 2}})
    assert info.value.param == "seed"


def test_extra_key_names_every_prompt_of_the_batch() -> None:
    assert parse_generate({"text": ["a", "b"], "extra_key": "tenant-1"}).cache_namespace == "tenant-1"
    assert parse_generate({"text": "a"}).cache_namespace is None


def test_nulls_mean_defaults() -> None:
    body = {"text": "a", "input_ids": None, "sampling_params": None, "rid": None,
            "return_logprob": None, "logprob_start_len": None, "stream": None}
    req = parse_generate(body)
    r = req.prompts[0]
    assert r.prompt == "a" and r.logprobs.start_len == -1 and not r.logprobs.enabled and not req.stream


@pytest.mark.parametrize("body, param", [
    ({}, "text"),
    ({"text": "a", "input_ids": [1]}, "text"),
    ({"text": ""}, "text"),
    ({"text": []}, "text"),
    ({"text": ["a", 3]}, "text[1]"),
    ({"text": ["a", ""]}, "text[1]"),
    ({"text": 5}, "text"),
    ({"input_ids": []}, "input_ids"),
    ({"input_ids": [1, -2]}, "input_ids[1]"),
    ({"input_ids": [1, True]}, "input_ids[1]"),
    ({"input_ids": [1.5]}, "input_ids[0]"),
    ({"input_ids": [[1], []]}, "input_ids[1]"),
    ({"input_ids": "1 2"}, "input_ids"),
    ({"text": "a", "sampling_params": "greedy"}, "sampling_params"),
    ({"text": "a", "sampling_params": {"temperature": -1}}, "sampling_params.temperature"),
    ({"text": "a", "sampling_params": {"greedy": True}}, "sampling_params.greedy"),
    ({"text": "a", "sampling_params": [{}, {}]}, "sampling_params"),
    ({"text": ["a", "b"], "sampling_params": [{}]}, "sampling_params"),
    ({"text": "a", "rid": ""}, "rid"),
    ({"text": "a", "rid": 5}, "rid"),
    ({"text": "a", "extra_key": ""}, "extra_key"),
    ({"text": "a", "extra_key": ["t"]}, "extra_key"),
    ({"text": "a", "extra_key": "k" * 1025}, "extra_key"),
    ({"text": ["a", "b"], "rid": ["x"]}, "rid"),
    ({"text": ["a", "b"], "rid": ["x", "x"]}, "rid"),
    ({"text": "a", "return_logprob": "yes"}, "return_logprob"),
    ({"text": ["a", "b"], "return_logprob": [True]}, "return_logprob"),
    ({"text": "a", "logprob_start_len": -2}, "logprob_start_len"),
    ({"text": "a", "logprob_start_len": 1.0}, "logprob_start_len"),
    ({"text": "a", "top_logprobs_num": -1}, "top_logprobs_num"),
    ({"text": "a", "return_text_in_logprobs": 1}, "return_text_in_logprobs"),
    ({"text": "a", "stream": "true"}, "stream"),
])
def test_rejections_name_the_field(body: dict[str, Any], param: str) -> None:
    with pytest.raises(InvalidRequest) as info:
        parse_generate(body)
    assert info.value.param == param, info.value.message
    assert info.value.message.startswith(param + ":")


def test_a_union_names_the_entry_of_the_reading_that_got_furthest() -> None:
    """[[1], 2] reads as a list of ids (entry 0 is no id) or of id lists (entry 1 is no list):
    the second reading got further, so entry 1 is named; likewise an id out of range is named
    rather than a type of another reading."""
    for body, param in (({"input_ids": [[1], 2]}, "input_ids[1]"), ({"input_ids": [-1, -2]}, "input_ids[0]"),
                        ({"text": ["a", 3, 4]}, "text[1]")):
        with pytest.raises(InvalidRequest) as info:
            parse_generate(body)
        assert info.value.param == param and info.value.message.startswith(param + ":"), body


@pytest.mark.parametrize("body", [None, [], "text", 3])
def test_body_must_be_an_object(body: Any) -> None:
    with pytest.raises(InvalidRequest, match="JSON object"):
        parse_generate(body)


def test_logprob_shapes() -> None:
    assert token_logprobs([None, -1.0], [5, 6], ["a", None]) == [[None, 5, "a"], [-1.0, 6, None]]
    tops = [None, [[7, 8], [-0.1, -2.0]]]
    seen: list[list[int]] = []

    def decode(ids: list[int]) -> list[str | None]:
        seen.append(ids)
        return [f"t{i}" for i in ids]

    assert top_logprobs(tops, decode) == [None, [[-0.1, 7, "t7"], [-2.0, 8, "t8"]]]
    assert seen == [[7, 8]]  # one decode call for the whole list


def _str_out(rid: str, text: str, ids: list[int], finished: dict[str, Any] | None = None,
             lp: bool = False, first: bool = False) -> BatchStrOut:
    k_tops = [[[t], [-0.5]] for t in ids]
    return BatchStrOut(
        rids=[rid], finished_reasons=[finished], texts=[text], output_ids=[ids],
        prompt_tokens=[3], completion_tokens=[len(ids)], cached_tokens=[1],
        output_logprobs=[[-0.5] * len(ids) if lp else None],
        output_top_logprobs=[k_tops if lp else None],
        input_logprobs=[[None, -1.0] if lp and first else None],
        input_top_logprobs=[[None, [[4], [-1.0]]] if lp and first else None],
        input_ids_for_logprobs=[[3, 4] if lp and first else None],
    )


def _state(return_logprob: bool, top: int = 0, stream: bool = False) -> ReqState:
    req = GenerateReq("r", [3, 4, 5], SamplingParams(), return_logprob=return_logprob,
                      top_logprobs_num=top, stream=stream)
    return ReqState.for_request(req, Group(), text_in_logprobs=True)


def _native(top: int, enabled: bool = True) -> GenRequest:
    return GenRequest([PromptRequest([3, 4, 5], "r", {}, Logprobs(enabled, 0, top, True), "input_ids")])


def _answer(req: GenRequest, deltas: list[StateDelta]) -> NativeAnswer:
    """/generate's answer folded from the deltas, as the pipeline reads them into events."""

    async def taken() -> AsyncIterator[Taken]:
        for delta in deltas:
            yield 0, delta

    async def fold() -> NativeAnswer:
        answer = NativeAnswer(req)
        async for update in read_updates(req, taken()):
            answer.update(update)
        return answer

    return asyncio.run(fold())


def test_state_accumulates_and_its_news_build_sglang_output() -> None:
    state = _state(return_logprob=True, top=1)
    texts = lambda ids: [f"<{i}>" for i in ids]  # noqa: E731
    apply_output(state, _str_out("r", "Hel", [10], lp=True, first=True), 0, 1.0, texts)
    first = take_delta(state)
    assert first.text == "Hel" and first.ids == [10] and first.finish_reason is None and not state.finished
    assert first.input == ([[None, 3, "<3>"], [-1.0, 4, "<4>"]], [None, [[-1.0, 4, "<4>"]]])
    apply_output(state, _str_out("r", "lo", [11, 12], {"type": "length", "length": 3}, lp=True),
                 0, 2.0, texts)
    second = take_delta(state)  # only what is new: the input logprobs came once
    assert second.text == "lo" and second.ids == [11, 12] and second.input is None
    assert second.logprobs == [[-0.5, t, f"<{t}>"] for t in (11, 12)]
    assert second.finish_reason == {"type": "length", "length": 3} and second.label == "r"
    assert state.finished and state.first_token_time == 1.0
    assert (second.prompt_tokens, second.completion_tokens, second.cached_tokens) == (3, 2, 1)
    assert take_delta(state).text == "" and take_delta(state).ids == []

    out = _answer(_native(top=1), [first, second]).final()
    meta = out["meta_info"]
    assert out["text"] == "Hello" and out["output_ids"] == [10, 11, 12]
    assert meta["finish_reason"] == {"type": "length", "length": 3}
    counts = (meta["prompt_tokens"], meta["completion_tokens"], meta["cached_tokens"])
    assert meta["id"] == "r" and counts == (3, 2, 1)
    assert meta["input_token_logprobs"] == [[None, 3, "<3>"], [-1.0, 4, "<4>"]]
    assert meta["output_token_logprobs"] == [[-0.5, t, f"<{t}>"] for t in (10, 11, 12)]
    assert meta["input_top_logprobs"] == [None, [[-1.0, 4, "<4>"]]]
    assert meta["output_top_logprobs"] == [[[-0.5, t, f"<{t}>"]] for t in (10, 11, 12)]
    second.ids.append(99)  # a delta and the answer are copies
    out["output_ids"].append(99)
    assert state.output_ids == [10, 11, 12]


def test_state_without_logprobs_has_no_logprob_fields() -> None:
    state = _state(return_logprob=False)
    apply_output(state, _str_out("r", "x", [1], {"type": "stop"}), 0, 1.0, lambda ids: [None] * len(ids))
    delta = take_delta(state)
    assert delta.logprobs is None and delta.tops is None and delta.input is None
    assert "output_token_logprobs" not in _answer(_native(0, enabled=False), [delta]).final()["meta_info"]
    state = _state(return_logprob=True, top=0)
    apply_output(state, _str_out("r", "x", [1], {"type": "stop"}, lp=True, first=True), 0, 1.0,
                 lambda ids: [None] * len(ids))
    delta = take_delta(state)
    assert delta.tops is None and delta.input is not None and delta.input[1] is None
    meta = _answer(_native(top=0), [delta]).final()["meta_info"]
    assert meta["input_top_logprobs"] is None and meta["output_top_logprobs"] is None


def test_group_collapses_news() -> None:
    async def main() -> list[list[int]]:
        group = Group()
        assert [group.add(), group.add(), group.add()] == [0, 1, 2]
        group.mark(2)
        group.mark(0)
        group.mark(2)
        first = await group.take()
        asyncio.get_running_loop().call_later(0.01, group.mark, 1)
        return [first, await group.take()]

    assert asyncio.run(main()) == [[2, 0], [1]]
