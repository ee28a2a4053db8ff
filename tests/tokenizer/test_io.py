"""Tests for tokenizer/generate_body.py (/generate body normalization) and
tokenizer/request_state.py (logprob shapes, per-request state)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from runtime.contracts.errors import InvalidRequest
from runtime.contracts.messages import BatchStrOut, GenerateReq
from runtime.contracts.sampling import SamplingParams
from tokenizer.generate_body import normalize_generate
from tokenizer.request_state import Group, ReqState, apply_output, build_output, token_logprobs, top_logprobs


def test_single_text_defaults() -> None:
    reqs, is_batch = normalize_generate({"text": "hi", "unknown_field": {"ignored": 1}})
    assert not is_batch and len(reqs) == 1
    r = reqs[0]
    assert r.text == "hi" and r.input_ids is None and r.prompt_field == "text"
    assert len(r.rid) == 32 and r.sampling_params == {}
    assert (r.return_logprob, r.logprob_start_len, r.top_logprobs_num) == (False, -1, 0)
    assert (r.return_text_in_logprobs, r.stream) == (False, False)


def test_batch_text_with_string_rid_and_shared_params() -> None:
    params = {"max_new_tokens": 3}
    reqs, is_batch = normalize_generate({"text": ["a", "b"], "rid": "x", "sampling_params": params,
                                         "stream": True})
    assert is_batch and [r.rid for r in reqs] == ["x_0", "x_1"]
    assert all(r.sampling_params == params and r.stream for r in reqs)
    reqs[0].sampling_params["max_new_tokens"] = 9  # each prompt owns a copy
    assert reqs[1].sampling_params == params


def test_input_ids_single_and_batch_with_per_item_fields() -> None:
    reqs, is_batch = normalize_generate({"input_ids": [1, 2, 3], "rid": "r"})
    assert not is_batch and reqs[0].input_ids == [1, 2, 3] and reqs[0].rid == "r"
    assert reqs[0].prompt_field == "input_ids"
    body = {"input_ids": [[1], [2, 3]], "rid": ["p", "q"], "return_logprob": [True, False],
            "logprob_start_len": [0, -1], "top_logprobs_num": 2,
            "sampling_params": [{"n": 1}, {"n": 2}], "return_text_in_logprobs": True}
    reqs, is_batch = normalize_generate(body)
    assert is_batch and [r.input_ids for r in reqs] == [[1], [2, 3]]
    assert [(r.rid, r.return_logprob, r.logprob_start_len, r.top_logprobs_num) for r in reqs] == [
        ("p", True, 0, 2), ("q", False, -1, 2)]
    assert [r.sampling_params for r in reqs] == [{"n": 1}, {"n": 2}]
    assert all(r.return_text_in_logprobs for r in reqs)


def test_extra_key_names_every_prompt_of_the_batch() -> None:
    reqs, _ = normalize_generate({"text": ["a", "b"], "extra_key": "tenant-1"})
    assert [r.extra_key for r in reqs] == ["tenant-1", "tenant-1"]
    assert normalize_generate({"text": "a"}).requests[0].extra_key is None


def test_nulls_mean_defaults() -> None:
    body = {"text": "a", "input_ids": None, "sampling_params": None, "rid": None,
            "return_logprob": None, "logprob_start_len": None, "stream": None}
    (r,), _ = normalize_generate(body)
    assert r.text == "a" and r.logprob_start_len == -1 and not r.stream


@pytest.mark.parametrize("body, param", [
    ({}, "text"),
    ({"text": "a", "input_ids": [1]}, "text"),
    ({"text": ""}, "text"),
    ({"text": []}, "text"),
    ({"text": ["a", 3]}, "text"),
    ({"text": ["a", ""]}, "text"),
    ({"text": 5}, "text"),
    ({"input_ids": []}, "input_ids"),
    ({"input_ids": [1, -2]}, "input_ids"),
    ({"input_ids": [1, True]}, "input_ids"),
    ({"input_ids": [1.5]}, "input_ids"),
    ({"input_ids": [[1], 2]}, "input_ids"),
    ({"input_ids": [[1], []]}, "input_ids"),
    ({"input_ids": "1 2"}, "input_ids"),
    ({"text": "a", "sampling_params": "greedy"}, "sampling_params"),
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
        normalize_generate(body)
    assert info.value.param == param, info.value.message


@pytest.mark.parametrize("body", [None, [], "text", 3])
def test_body_must_be_an_object(body: Any) -> None:
    with pytest.raises(InvalidRequest):
        normalize_generate(body)


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


def test_state_accumulates_and_builds_sglang_output() -> None:
    state = _state(return_logprob=True, top=1)
    texts = lambda ids: [f"<{i}>" for i in ids]  # noqa: E731
    apply_output(state, _str_out("r", "Hel", [10], lp=True, first=True), 0, 1.0, texts)
    out = build_output(state)
    assert out["text"] == "Hel" and out["output_ids"] == [10]
    assert out["meta_info"]["finish_reason"] is None and not state.finished
    apply_output(state, _str_out("r", "lo", [11, 12], {"type": "length", "length": 3}, lp=True),
                 0, 2.0, texts)
    out = build_output(state)
    meta = out["meta_info"]
    assert out["text"] == "Hello" and out["output_ids"] == [10, 11, 12]
    assert state.finished and state.first_token_time == 1.0
    assert meta["finish_reason"] == {"type": "length", "length": 3}
    counts = (meta["prompt_tokens"], meta["completion_tokens"], meta["cached_tokens"])
    assert meta["id"] == "r" and counts == (3, 2, 1)
    assert meta["input_token_logprobs"] == [[None, 3, "<3>"], [-1.0, 4, "<4>"]]
    assert meta["output_token_logprobs"] == [[-0.5, t, f"<{t}>"] for t in (10, 11, 12)]
    assert meta["input_top_logprobs"] == [None, [[-1.0, 4, "<4>"]]]
    assert meta["output_top_logprobs"] == [[[-0.5, t, f"<{t}>"]] for t in (10, 11, 12)]
    out["output_ids"].append(99)  # the result is a copy
    assert state.output_ids == [10, 11, 12]


def test_state_without_logprobs_has_no_logprob_fields() -> None:
    state = _state(return_logprob=False)
    apply_output(state, _str_out("r", "x", [1]), 0, 1.0, lambda ids: [None] * len(ids))
    assert "output_token_logprobs" not in build_output(state)["meta_info"]
    state = _state(return_logprob=True, top=0)
    meta = build_output(state)["meta_info"]
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
