"""SamplingParams: SGLang defaults, parsing, type and range validation, wire form."""

from __future__ import annotations

import json
import math

import pytest

from runtime.contracts.errors import InvalidRequest
from runtime.contracts.sampling import MAX_GRAMMAR_AFTER_IDS, MAX_STOP_STRS, SamplingParams

SGLANG_DEFAULTS = {
    "max_new_tokens": 128, "stop": None, "stop_token_ids": None, "temperature": 1.0,
    "top_p": 1.0, "top_k": -1, "min_p": 0.0, "frequency_penalty": 0.0, "presence_penalty": 0.0,
    "repetition_penalty": 1.0, "min_new_tokens": 0, "n": 1, "json_schema": None, "regex": None,
    "ebnf": None, "ignore_eos": False, "skip_special_tokens": True,
    "spaces_between_special_tokens": True, "no_stop_trim": False, "logit_bias": None,
    "seed": None, "stream_interval": None,
    "grammar_after_ids": None,  # ours: a grammar that starts after the reasoning
}


def test_defaults_match_sglang():
    assert SamplingParams().to_dict() == SGLANG_DEFAULTS
    SamplingParams().validate(vocab_size=10)


def test_from_dict_maps_fields_one_to_one():
    body = {"max_new_tokens": 7, "temperature": 0, "top_p": 1, "stop": ["a", "b"], "n": 2,
            "stop_token_ids": [1, 2], "ignore_eos": True, "logit_bias": {"5": -3}}
    p = SamplingParams.from_dict(body)
    got = (p.max_new_tokens, p.n, p.stop, p.stop_token_ids, p.ignore_eos)
    assert got == (7, 2, ["a", "b"], [1, 2], True)
    assert isinstance(p.temperature, float) and isinstance(p.top_p, float)
    assert p.logit_bias == {5: -3.0}


# (body, vocab_size, param) -- each must raise InvalidRequest naming `param`.
INVALID = [
    ({"temperature": "0.5"}, None, "temperature"),
    ({"temperature": True}, None, "temperature"),
    ({"temperature": -0.1}, None, "temperature"),
    ({"temperature": math.inf}, None, "temperature"),
    ({"temperature": math.nan}, None, "temperature"),
    ({"top_p": 0}, None, "top_p"),
    ({"top_p": 1.01}, None, "top_p"),
    ({"top_p": math.nan}, None, "top_p"),
    ({"top_k": 0}, None, "top_k"),
    ({"top_k": -2}, None, "top_k"),
    ({"top_k": 2.0}, None, "top_k"),
    ({"top_k": True}, None, "top_k"),
    ({"min_p": -0.01}, None, "min_p"),
    ({"min_p": 1.5}, None, "min_p"),
    ({"frequency_penalty": 2.5}, None, "frequency_penalty"),
    ({"frequency_penalty": -2.01}, None, "frequency_penalty"),
    ({"presence_penalty": -3}, None, "presence_penalty"),
    ({"presence_penalty": "1"}, None, "presence_penalty"),
    ({"repetition_penalty": 0}, None, "repetition_penalty"),
    ({"repetition_penalty": 2.1}, None, "repetition_penalty"),
    ({"max_new_tokens": -1}, None, "max_new_tokens"),
    ({"max_new_tokens": "10"}, None, "max_new_tokens"),
    ({"min_new_tokens": -1}, None, "min_new_tokens"),
    ({"min_new_tokens": 5, "max_new_tokens": 4}, None, "min_new_tokens"),
    ({"n": 0}, None, "n"),
    ({"n": 1.5}, None, "n"),
    ({"stop": ""}, None, "stop"),
    ({"stop": ["ok", ""]}, None, "stop"),
    ({"stop": ["s"] * (MAX_STOP_STRS + 1)}, None, "stop"),
    ({"stop": 3}, None, "stop"),
    ({"stop": ["a", 1]}, None, "stop"),
    ({"stop_token_ids": [1, "2"]}, None, "stop_token_ids"),
    ({"stop_token_ids": 5}, None, "stop_token_ids"),
    ({"stop_token_ids": [-1]}, None, "stop_token_ids"),
    ({"stop_token_ids": [10]}, 10, "stop_token_ids"),
    ({"logit_bias": {"10": 1}}, 10, "logit_bias"),
    ({"logit_bias": {"-1": 1}}, None, "logit_bias"),
    ({"logit_bias": {"abc": 1}}, None, "logit_bias"),
    ({"logit_bias": {"1.5": 1}}, None, "logit_bias"),
    ({"logit_bias": {"1": 101}}, None, "logit_bias"),
    ({"logit_bias": {"1": -100.5}}, None, "logit_bias"),
    ({"logit_bias": {"1": math.inf}}, None, "logit_bias"),
    ({"logit_bias": {"1": "2"}}, None, "logit_bias"),
    ({"logit_bias": [1, 2]}, None, "logit_bias"),
    ({"json_schema": "{}", "regex": "a+"}, None, "regex"),
    ({"regex": "a+", "ebnf": "root ::= 'a'"}, None, "ebnf"),
    ({"regex": 5}, None, "regex"),
    ({"ebnf": ["x"]}, None, "ebnf"),
    ({"json_schema": 3}, None, "json_schema"),
    ({"seed": "7"}, None, "seed"),
    ({"seed": 1.0}, None, "seed"),
    ({"seed": -1}, None, "seed"),
    ({"seed": 1 << 63}, None, "seed"),
    ({"sampling_seed": "x"}, None, "seed"),
    ({"seed": 1, "sampling_seed": 2}, None, "seed"),
    ({"ignore_eos": 1}, None, "ignore_eos"),
    ({"skip_special_tokens": "yes"}, None, "skip_special_tokens"),
    ({"spaces_between_special_tokens": 0}, None, "spaces_between_special_tokens"),
    ({"no_stop_trim": "false"}, None, "no_stop_trim"),
    ({"stream_interval": 0}, None, "stream_interval"),
    ({"stream_interval": 1.5}, None, "stream_interval"),
    ({"grammar_after_ids": [5]}, None, "grammar_after_ids"),  # without a grammar
    ({"regex": "a", "grammar_after_ids": []}, None, "grammar_after_ids"),
    ({"regex": "a", "grammar_after_ids": [1] * (MAX_GRAMMAR_AFTER_IDS + 1)}, None, "grammar_after_ids"),
    ({"regex": "a", "grammar_after_ids": [10]}, 10, "grammar_after_ids"),
    ({"regex": "a", "grammar_after_ids": [-1]}, None, "grammar_after_ids"),
    ({"regex": "a", "grammar_after_ids": ["5"]}, None, "grammar_after_ids"),
    ({"regex": "a", "grammar_after_ids": 5}, None, "grammar_after_ids"),
    ({"bogus": 1}, None, "bogus"),
    ({"stop_regex": "x"}, None, "stop_regex"),
]


IDS = [f"{case[2]}-{i}" for i, case in enumerate(INVALID)]


@pytest.mark.parametrize("body,vocab,param", INVALID, ids=IDS)
def test_invalid_values_rejected_naming_the_field(body, vocab, param):
    with pytest.raises(InvalidRequest) as err:
        SamplingParams.from_dict(body).validate(vocab_size=vocab)
    assert err.value.param == param
    assert param.split("|")[0] in str(err.value) or "sampling parameter" in str(err.value)


def test_range_messages_state_the_allowed_range():
    cases = {"top_p": (0, "(0, 1]"), "min_p": (2, "[0, 1]"), "repetition_penalty": (3, "(0, 2]"),
             "frequency_penalty": (3, "[-2, 2]"), "top_k": (0, "-1")}
    for name, (value, allowed) in cases.items():
        with pytest.raises(InvalidRequest) as err:
            SamplingParams.from_dict({name: value}).validate()
        assert allowed in err.value.message


def test_validate_also_checks_directly_constructed_params():
    with pytest.raises(InvalidRequest) as err:
        SamplingParams(temperature="hot").validate()  # type: ignore[arg-type]
    assert err.value.param == "temperature"
    with pytest.raises(InvalidRequest) as err:
        SamplingParams(logit_bias={"7": 1.0}).validate(vocab_size=5)
    assert err.value.param == "logit_bias"


def test_non_object_body_rejected():
    with pytest.raises(InvalidRequest) as err:
        SamplingParams.from_dict([("temperature", 1)])  # type: ignore[arg-type]
    assert err.value.param == "sampling_params"


@pytest.mark.parametrize("body", [
    {"top_p": 1}, {"top_p": 1e-9}, {"top_k": -1}, {"top_k": 1}, {"temperature": 0},
    {"min_p": 0}, {"min_p": 1}, {"repetition_penalty": 2}, {"frequency_penalty": -2},
    {"presence_penalty": 2}, {"max_new_tokens": 0}, {"min_new_tokens": 5, "max_new_tokens": 5},
    {"stop": "x"}, {"stop": []}, {"stop": ["s"] * MAX_STOP_STRS}, {"stop_token_ids": [0, 9]},
    {"logit_bias": {"0": -100, "9": 100}}, {"logit_bias": {3: 1.5}}, {"seed": 0},
    {"seed": (1 << 63) - 1}, {"json_schema": {"type": "object"}}, {"regex": "a+"},
    {"temperature": None, "top_p": None, "stop": None}, {"stream_interval": 1},
])
def test_valid_edge_cases_accepted(body):
    SamplingParams.from_dict(body).validate(vocab_size=10)


def test_null_means_default():
    p = SamplingParams.from_dict({"temperature": None, "max_new_tokens": None, "n": None})
    assert (p.temperature, p.max_new_tokens, p.n) == (1.0, 128, 1)


def test_sampling_seed_alias_stored_as_seed():
    assert SamplingParams.from_dict({"sampling_seed": 42}).seed == 42
    assert SamplingParams.from_dict({"seed": 42}).to_dict()["seed"] == 42


def test_json_schema_object_stored_as_text():
    p = SamplingParams.from_dict({"json_schema": {"type": "object"}})
    assert json.loads(p.json_schema) == {"type": "object"}


def test_is_greedy_and_stop_strs():
    assert SamplingParams(temperature=0).is_greedy
    assert SamplingParams(temperature=1e-7).is_greedy
    assert SamplingParams(top_k=1).is_greedy
    assert not SamplingParams(temperature=0.5).is_greedy
    assert SamplingParams(stop="x").stop_strs == ["x"]
    assert SamplingParams(stop=["a", "b"]).stop_strs == ["a", "b"]
    assert SamplingParams().stop_strs == []


def test_to_dict_is_plain_json_and_round_trips():
    body = {"temperature": 0.7, "stop": ["\n"], "stop_token_ids": [2],
            "logit_bias": {"3": 1.5, 4: -2},
            "seed": 9, "json_schema": '{"type": "string"}', "top_k": 20, "stream_interval": 4,
            "grammar_after_ids": [7, 8]}
    p = SamplingParams.from_dict(body)
    wire = json.loads(json.dumps(p.to_dict()))
    assert wire["logit_bias"] == {"3": 1.5, "4": -2.0}
    assert SamplingParams.from_dict(wire) == p
