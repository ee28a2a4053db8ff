"""Round trips of every message type through the codec, codec errors, and the dispatcher."""

from __future__ import annotations

import math
from dataclasses import dataclass

import pytest

from runtime.contracts import codec
from runtime.contracts.codec import CodecError, TypeDispatcher, decode, encode
from runtime.contracts.messages import (
    MESSAGE_TYPES,
    AbortReq,
    BatchStrOut,
    BatchTokenOut,
    ChildReady,
    FlushCacheOut,
    FlushCacheReq,
    GenerateReq,
    GetStateReq,
    SchedulerCrashed,
    ShutdownReq,
    StateOut,
    TPSharedMemory,
    TPStep,
    TPStop,
    message,
)
from runtime.contracts.sampling import SamplingParams


def _params() -> SamplingParams:
    return SamplingParams(
        max_new_tokens=7, stop=["</s>", "日本"], stop_token_ids=[2, 3], temperature=0.5,
        top_p=0.9, top_k=40, min_p=0.05, frequency_penalty=0.1, presence_penalty=-0.2,
        repetition_penalty=1.1, min_new_tokens=1, n=2, regex="a+", ignore_eos=True,
        skip_special_tokens=False, spaces_between_special_tokens=False, no_stop_trim=True,
        logit_bias={5: -1.5, 7: 2.0}, seed=2**62, stream_interval=3, grammar_after_ids=[9, 10],
    )


def _token_out() -> BatchTokenOut:
    top = [[11, 12], [-0.1, -2.5]]
    return BatchTokenOut(
        rids=["a", "b_0", "ü"],
        finished_reasons=[None, {"type": "stop", "matched": 2}, {"type": "abort", "message": "ç"}],
        new_ids=[[1, 2], [2], []],
        decode_prefix=[[9, 8, 7, 6, 5], None, []],
        prompt_tokens=[5, 3, 0],
        completion_tokens=[2, 4, 0],
        cached_tokens=[0, 2, 0],
        skip_special_tokens=[True, False, True],
        spaces_between_special_tokens=[True, True, False],
        stop_strs=[["\n\n"], [], ["終"]],
        no_stop_trim=[False, True, False],
        matched_stop_token=[False, True, False],
        output_logprobs=[[-0.5, -1.25], None, []],
        output_top_logprobs=[[top, top], None, []],
        input_logprobs=[[None, -3.0, -0.75], None, None],
        input_top_logprobs=[[None, top, top], None, None],
        input_ids_for_logprobs=[[9, 8, 7], None, None],
    )


def _str_out() -> BatchStrOut:
    return BatchStrOut(
        rids=["a", "b_0"],
        finished_reasons=[None, {"type": "length", "length": 4}],
        texts=["héllo 👋", ""],
        output_ids=[[1, 2], []],
        prompt_tokens=[5, 3],
        completion_tokens=[2, 4],
        cached_tokens=[0, 2],
        output_logprobs=[[-0.5, -1.0], None],
        output_top_logprobs=[[[[1], [-0.5]], [[2], [-1.0]]], None],
        input_logprobs=[None, [None, -2.0]],
        input_top_logprobs=[None, [None, [[4, 5], [-2.0, -3.0]]]],
        input_ids_for_logprobs=[None, [3, 4]],
    )


SAMPLES = [
    GenerateReq("rid-1", [1, 2, 3], _params(), return_logprob=True, logprob_start_len=0,
                top_logprobs_num=5, stream=True, extra_key="salt✓", prefill_only_cache=True),
    GenerateReq("", [], SamplingParams()),
    AbortReq("rid-1"),
    AbortReq(abort_all=True),
    FlushCacheReq(3),
    GetStateReq(4),
    ShutdownReq(),
    _token_out(),
    _str_out(),
    FlushCacheOut(3, False, "requests are running"),
    FlushCacheOut(5, True),
    StateOut(4, {"running": 2, "nested": {"list": [1, None, "x"]}, "ok": True}),
    SchedulerCrashed("scheduler", "Traceback (most recent call last):\n  ValueError: ∅"),
    ChildReady("detokenizer", {}),
    ChildReady("scheduler", {"max_total_tokens": 4096, "max_running_requests": 64}),
    TPSharedMemory("/dev/shm/radixserve-tp-0123"),
    TPStep([[3, [1, 2], 0, [5, 6], 0, {"temperature": 0.5}, [], [], False, 0, 0, None, False, None, None]], True),
    TPStop(),
]


@pytest.mark.parametrize("msg", SAMPLES, ids=lambda m: type(m).__name__)
def test_round_trip(msg: object) -> None:
    data = encode(msg)
    assert isinstance(data, bytes)
    out = decode(data)
    assert type(out) is type(msg)
    assert out == msg


def test_every_message_type_has_a_sample() -> None:
    assert {type(m) for m in SAMPLES} == set(MESSAGE_TYPES.values())


def test_nested_sampling_params_keeps_non_defaults() -> None:
    out = decode(encode(SAMPLES[0]))
    assert out.sampling_params.logit_bias == {5: -1.5, 7: 2.0}
    assert out.sampling_params.seed == 2**62
    assert out.sampling_params.stop == ["</s>", "日本"]


def test_tuples_become_lists_and_non_finite_floats_become_none() -> None:
    out = decode(encode(StateOut(1, {"t": (1, 2), "inf": -math.inf, "nan": math.nan})))
    assert out.state == {"t": [1, 2], "inf": None, "nan": None}


def test_unknown_tag_and_bad_frames_are_rejected() -> None:
    with pytest.raises(CodecError, match="unknown message tag 'NoSuchMsg'"):
        decode(b'["NoSuchMsg", 1]')
    with pytest.raises(CodecError, match="type tag"):
        decode(b'{"rid": "x"}')
    with pytest.raises(CodecError, match="type tag"):
        decode(b"[]")
    with pytest.raises(CodecError, match="not valid JSON"):
        decode(b"\x80\x04pickle")
    with pytest.raises(CodecError, match="2 fields, frame has 1"):
        decode(b'["AbortReq", "x"]')


def test_unencodable_values_are_rejected() -> None:
    with pytest.raises(CodecError, match="not a registered message"):
        encode(_params())
    with pytest.raises(CodecError, match="cannot encode StateOut"):
        encode(StateOut(1, {"x": object()}))
    with pytest.raises(CodecError, match="cannot encode StateOut"):
        encode(StateOut(1, {"sp": _params()}))  # a dataclass where the annotation has none


@pytest.fixture
def scratch_types():
    """Register throwaway message types for one test, then forget them."""
    added: list[type] = []

    def register(cls: type) -> type:
        added.append(message(cls))
        return cls

    yield register
    for cls in added:
        del MESSAGE_TYPES[cls.__name__]
        codec._PLANS.pop(cls, None)


def test_nested_lists_optionals_and_messages(scratch_types) -> None:
    @dataclass(slots=True)
    class _Outer:
        params: list[SamplingParams]
        maybe: SamplingParams | None
        inner: AbortReq
        inners: list[AbortReq] | None

    scratch_types(_Outer)
    msg = _Outer([_params(), SamplingParams()], None, AbortReq("r"), [AbortReq(abort_all=True)])
    assert decode(encode(msg)) == msg
    msg = _Outer([], _params(), AbortReq(), None)
    assert decode(encode(msg)) == msg


def test_unsupported_nesting_is_rejected(scratch_types) -> None:
    @dataclass(slots=True)
    class _BadNest:
        by_name: dict[str, SamplingParams]

    scratch_types(_BadNest)
    with pytest.raises(CodecError, match="unsupported nesting"):
        encode(_BadNest({}))


def test_abort_matches_the_rid_and_its_own_fan_out_only() -> None:
    abort = AbortReq("abc")
    assert abort.matches("abc") and abort.matches("abc_0") and abort.matches("abc_1_2")
    assert abort.matches("abc_warmup") and abort.matches("abc_3_warmup")  # n>1 warm-up copies
    assert not abort.matches("abc_bar") and not abort.matches("abc_1x") and not abort.matches("abc_")
    assert not abort.matches("abcd") and not abort.matches("ab")
    assert not AbortReq("").matches("abc")
    assert AbortReq(abort_all=True).matches("anything")


def test_dispatcher_routes_by_exact_type() -> None:
    seen: list[object] = []
    dispatch = TypeDispatcher({AbortReq: seen.append, FlushCacheReq: lambda m: m.req_id * 10})
    assert dispatch(FlushCacheReq(4)) == 40
    dispatch(AbortReq("x"))
    assert seen == [AbortReq("x")]
    with pytest.raises(TypeError, match="no handler for message type GetStateReq"):
        dispatch(GetStateReq(1))


def _batch(n: int) -> BatchTokenOut:
    return BatchTokenOut(
        rids=[f"{i:032x}" for i in range(n)], finished_reasons=[None] * n,
        new_ids=[[1000 + i] for i in range(n)], decode_prefix=[None] * n,
        prompt_tokens=[100] * n, completion_tokens=[7] * n, cached_tokens=[64] * n,
        skip_special_tokens=[True] * n, spaces_between_special_tokens=[True] * n,
        stop_strs=[[]] * n, no_stop_trim=[False] * n, matched_stop_token=[False] * n,
        output_logprobs=[None] * n, output_top_logprobs=[None] * n, input_logprobs=[None] * n,
        input_top_logprobs=[None] * n, input_ids_for_logprobs=[None] * n,
    )


def test_big_batch_round_trip() -> None:
    """A 256-request BatchTokenOut survives the codec intact (its speed is not a test matter:
    a round trip measured tens of microseconds here)."""
    msg = _batch(256)
    assert decode(encode(msg)) == msg
