"""Hostile chat bodies against the validation alone (`parse_chat`: the chat spec and its checks; no
server, no tokenizer): every one is an InvalidRequest naming the field's full path, never another
exception; `chat_template_kwargs` carries template variables only; a request's template needs
--trust-request-chat-template.

Lone surrogates in plain strings (content, names, stop) never reach the parse: the server's JSON
reader (orjson) refuses them in a body; where a JSON text inside a string is parsed again (a
history call's `arguments`) or free JSON is bounded (tool parameters, template variables), they
are refused here."""

from __future__ import annotations

import copy
import inspect
import json
from typing import Any

import orjson
import pytest

from runtime.contracts.config import ServerConfig, add_cli_arguments, config_from_args
from runtime.contracts.errors import InvalidRequest
from tokenizer.core.chat_template import RESERVED, RequestTemplate, reserved_names
from tokenizer.core.json_bounds import Bounds, describe, find_problem, load_json_text
from tokenizer.core.request import ChatInput
from tokenizer.core.tool_calls import ToolCallStream, parse_tool_calls
from tokenizer.openai.chat import ChatRequest, parse_chat

DEEP_LIST = orjson.loads("[" * 1000 + "]" * 1000)  # what orjson lets through (limit 1024)
DEEP_OBJECT = orjson.loads('{"a":' * 1000 + "{}" + "}" * 1000)
ARGS = "messages[1].tool_calls[0].function.arguments"
TOOL = {"type": "function", "function": {
    "name": "f", "description": "d",
    "parameters": {"type": "object", "properties": {"x": {"type": "string"}}}}}
BODY: dict[str, Any] = {
    "model": "m", "max_tokens": 4, "tools": [TOOL],
    "messages": [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "done"}],
}


def _with(path: tuple[Any, ...], value: Any) -> dict[str, Any]:
    body = copy.deepcopy(BODY)
    target = body
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    return body


def _chat(body: Any, trust: bool = False) -> ChatRequest:
    return parse_chat(body, ServerConfig(trust_request_chat_template=trust), "m")


def _input(body: Any, trust: bool = False) -> ChatInput:
    prompt = _chat(body, trust).req.prompts[0].prompt
    assert isinstance(prompt, ChatInput)
    return prompt


def _rejected(body: Any, trust: bool = False) -> InvalidRequest:
    with pytest.raises(InvalidRequest) as info:
        _chat(body, trust)
    json.dumps(info.value.message).encode("utf-8")  # the message itself can be sent
    param = info.value.param
    assert param is not None and info.value.message.startswith(param), info.value.message[:200]
    assert len(info.value.message) < 1000  # never a client's megabytes echoed back
    return info.value


HOSTILE: list[tuple[tuple[Any, ...], Any, str | None]] = [
    # (where in BODY, value, the param of the 400)
    (("messages", 1, "tool_calls", 0, "function", "arguments"), "[" * 50_000 + "]" * 50_000, ARGS),
    (("messages", 1, "tool_calls", 0, "function", "arguments"), '{"x": "\\ud800"}', ARGS),
    (("messages", 1, "tool_calls", 0, "function", "arguments"), '{"x": 1e400}', ARGS),
    (("messages", 1, "tool_calls", 0, "function", "arguments"), '{"x": 1' + "0" * 5000 + "}", ARGS),
    (("messages", 1, "tool_calls", 0, "function", "arguments"), '{"x": NaN}', ARGS),
    (("messages", 1, "tool_calls", 0, "function", "arguments"), "[" * 70 + "]" * 70, ARGS),
    (("messages", 1, "tool_calls", 0, "function", "arguments"), "\ud800 not json", ARGS),
    (("messages", 1, "tool_calls", 0, "function", "arguments"), DEEP_OBJECT, ARGS),
    (("messages", 1, "tool_calls", 0, "function", "arguments"), {"x": float("inf")}, ARGS),
    (("messages", 1, "tool_calls", 0, "function", "arguments"), {"x": 10**5000}, ARGS),
    (("messages", 1, "tool_calls", 0, "function", "arguments"), [1], ARGS),
    (("messages", 1, "tool_calls", 0, "function", "name"), "\udc00", "messages[1].tool_calls[0].function.name"),
    (("messages", 1, "tool_calls", 0, "function", "name"), DEEP_LIST, "messages[1].tool_calls[0].function.name"),
    (("messages", 1, "tool_calls", 0, "id"), DEEP_LIST, "messages[1].tool_calls[0].id"),
    (("messages", 1, "tool_calls", 0, "id"), 10**5000, "messages[1].tool_calls[0].id"),
    (("messages", 1, "tool_calls", 0, "type"), DEEP_OBJECT, "messages[1].tool_calls[0].type"),
    (("messages", 1, "tool_calls", 0), DEEP_LIST, "messages[1].tool_calls[0]"),
    (("messages", 1, "tool_calls"), {"a": 1}, "messages[1].tool_calls"),
    (("messages", 0, "role"), DEEP_LIST, "messages[0].role"),
    (("messages", 0, "role"), ["user"], "messages[0].role"),
    (("messages", 0, "role"), {"a": 1}, "messages[0].role"),
    (("messages", 0, "content"), [{"type": DEEP_LIST}], "messages[0].content[0].type"),
    (("messages", 0, "content"), DEEP_OBJECT, "messages[0].content"),
    (("messages", 0, "name"), DEEP_LIST, "messages[0].name"),
    (("messages", 2, "tool_call_id"), 7, "messages[2].tool_call_id"),
    (("messages", 0), DEEP_LIST, "messages[0]"),
    (("tools", 0, "function", "description"), DEEP_OBJECT, "tools[0].function.description"),
    (("tools", 0, "function", "name"), DEEP_LIST, "tools[0].function.name"),
    (("tools", 0, "function", "strict"), "yes", "tools[0].function.strict"),
    (("tools", 0, "function", "parameters", "properties"), DEEP_OBJECT, "tools[0].function.parameters"),
    (("tools", 0, "function", "parameters", "properties", "x"), {"enum": ["\ud800"]},
     "tools[0].function.parameters"),
    (("tool_choice",), DEEP_OBJECT, "tool_choice.type"),
    (("tool_choice",), {"type": "function", "function": {"name": DEEP_LIST}}, "tool_choice.function.name"),
    (("response_format",), {"type": DEEP_LIST}, "response_format.type"),
    (("response_format",), {"type": "y" * 100_000}, "response_format.type"),
    (("timeout",), DEEP_LIST, "timeout"),
    (("temperature",), 10**5000, "temperature"),
    (("stop",), [DEEP_LIST], "stop[0]"),
    (("stop",), ["x" * 100_000], "stop[0]"),
    (("return_hidden_states",), DEEP_OBJECT, "return_hidden_states"),
    (("stream_options",), {"x" * 100_000: 1}, "stream_options"),
    (("x" * 100_000,), 1, None),
    (("chat_template_kwargs",), DEEP_LIST, "chat_template_kwargs"),
    (("chat_template_kwargs",), {"x": DEEP_OBJECT}, "chat_template_kwargs.x"),
]


@pytest.mark.parametrize(("path", "value", "param"), HOSTILE,
                         ids=[f"{i}-{'.'.join(map(str, h[0]))}" for i, h in enumerate(HOSTILE)])
def test_hostile_values_are_400s_naming_the_field(path: tuple[Any, ...], value: Any,
                                                  param: str | None) -> None:
    if param is None:  # an unknown top-level field with a huge name: the error names no field
        with pytest.raises(InvalidRequest) as info:
            _chat(_with(path, value))
        assert info.value.param is None and len(info.value.message) < 1000
        return
    assert _rejected(_with(path, value)).param == param


def test_the_unharmed_body_passes_and_keeps_its_shape() -> None:
    chat = _chat(copy.deepcopy(BODY))
    prompt = chat.req.prompts[0].prompt
    assert isinstance(prompt, ChatInput)
    call = prompt.messages[1]["tool_calls"][0]
    assert call == {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    assert prompt.tools is not None and prompt.tools.as_openai_tools() == [TOOL]
    assert prompt.variables == {} and prompt.template is None
    fine = _with(("messages", 1, "tool_calls", 0, "function", "arguments"), "not json at all")
    kept = _input(fine).messages[1]["tool_calls"][0]["function"]["arguments"]
    assert kept == "not json at all"  # a history is rendered as written, not judged


# ---------------------------------------------------------------- chat_template_kwargs


@pytest.mark.parametrize("key", sorted(RESERVED))
def test_apply_chat_template_parameters_are_not_template_variables(key: str) -> None:
    error = _rejected({**BODY, "chat_template_kwargs": {key: True}})
    assert error.param == f"chat_template_kwargs.{key}"


def test_a_request_template_needs_the_trust_flag() -> None:
    injected = {"chat_template": "Z{{ messages[0].content }}"}
    error = _rejected({**BODY, "chat_template_kwargs": injected})
    assert error.param == "chat_template_kwargs.chat_template"
    assert "--trust-request-chat-template" in error.message
    error = _rejected({**BODY, "chat_template": "Z{{ messages[0].content }}"})
    assert error.param == "chat_template"


def test_with_the_trust_flag_a_request_template_goes_through() -> None:
    for body, where in (({**BODY, "chat_template_kwargs": {"chat_template": "T", "flag": 1}},
                         "chat_template_kwargs.chat_template"),
                        ({**BODY, "chat_template": "T", "chat_template_kwargs": {"flag": 1}}, "chat_template")):
        prompt = _input(body, trust=True)
        assert prompt.template == RequestTemplate("T", where) and prompt.variables == {"flag": 1}
        assert prompt.tools is not None and prompt.tools.as_openai_tools() == [TOOL]
    both = {**BODY, "chat_template": "T", "chat_template_kwargs": {"chat_template": "U"}}
    assert _rejected(both, trust=True).param == "chat_template_kwargs.chat_template"
    for bad in ("", 5, "x" * 70_000):
        assert _rejected({**BODY, "chat_template": bad}, trust=True).param == "chat_template"
    for bad in ("", 5, "   "):
        injected = {**BODY, "chat_template_kwargs": {"chat_template": bad}}
        assert _rejected(injected, trust=True).param == "chat_template_kwargs.chat_template"


def test_template_variables_are_small_plain_json() -> None:
    body = {**BODY, "chat_template_kwargs": {"enable_thinking": False, "reasoning_effort": "low",
                                             "opts": {"a": [1, 2.5, None]}}}
    prompt = _input(body)
    assert prompt.variables["enable_thinking"] is False and prompt.template is None
    bad: list[tuple[dict[str, Any], str]] = [
        ({"a-b": 1}, "chat_template_kwargs.a-b"), ({"1a": 1}, "chat_template_kwargs.1a"),
        ({"x" * 65: 1}, "chat_template_kwargs"), ({"s": "x" * 20_000}, "chat_template_kwargs.s"),
        ({"d": [[[[[[[[[1]]]]]]]]]}, "chat_template_kwargs.d"),
        ({f"k{i}": "x" * 9000 for i in range(8)}, "chat_template_kwargs"),  # 64 KiB in all
        ({f"k{i}": i for i in range(65)}, "chat_template_kwargs"),
        ({"s": "\ud800"}, "chat_template_kwargs.s"), ({"f": float("nan")}, "chat_template_kwargs.f"),
    ]
    for kwargs, param in bad:
        assert _rejected({**BODY, "chat_template_kwargs": kwargs}).param == param, kwargs


def test_reserved_names_cover_the_installed_transformers() -> None:
    from transformers import PreTrainedTokenizerBase
    from transformers.utils.chat_template_utils import render_jinja_template

    for fn in (PreTrainedTokenizerBase.apply_chat_template, render_jinja_template):
        for p in inspect.signature(fn).parameters.values():
            if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
                assert p.name in reserved_names(), p.name
    assert "enable_thinking" not in reserved_names() and "messages" in reserved_names()


def test_the_trust_flag_is_a_config_field_and_a_cli_flag() -> None:
    import argparse

    assert ServerConfig().trust_request_chat_template is False
    parser = argparse.ArgumentParser()
    add_cli_arguments(parser)
    assert config_from_args(parser.parse_args([])).trust_request_chat_template is False
    args = parser.parse_args(["--trust-request-chat-template"])
    assert config_from_args(args).trust_request_chat_template is True


# ---------------------------------------------------------------- the bounds themselves


def test_find_problem_names_the_inner_path_without_recursing() -> None:
    assert find_problem({"a": [1, "x", None, True, 2.5]}) is None
    assert "nested too deeply" in find_problem(DEEP_LIST, Bounds(max_depth=64))
    assert find_problem({"a": [0, {"b": "\ud800"}]}).endswith("at .a[1].b")
    assert "not finite" in find_problem([float("-inf")])
    assert "integer out of range" in find_problem([2**64])
    assert "not JSON" in find_problem({"a": (1, 2)})
    assert "not a string" in find_problem({1: "a"})
    assert "too large" in find_problem(["x" * 10] * 10, Bounds(max_total=50))
    assert describe(DEEP_LIST) == "a list" and describe(10**5000) == "an integer out of range"
    assert describe("\ud800") == "'\\ud800'"


def test_load_json_text() -> None:
    assert load_json_text('{"city": "Paris"}', "p") == {"city": "Paris"}
    assert load_json_text("{not json", "p") == "{not json"
    assert load_json_text('"\\ud83d\\ude00"', "p") == "\U0001F600"  # a valid pair
    assert load_json_text("-" + "9" * 30, "p") == -1e30  # orjson's reading: a finite float
    for text in ("[" * 50_000, '["\\ud800"]', "[1e400]", "-" + "9" * 5000, "[Infinity]",
                 "[" * 65 + "]" * 65):
        with pytest.raises(InvalidRequest) as info:
            load_json_text(text, "p")
        assert info.value.param == "p", text


# ---------------------------------------------------------------- outputs a client can steer


@pytest.mark.parametrize("text", [
    "[" * 5000 + "]" * 5000,
    '{"name": "f", "arguments": ' + "[" * 3000 + "]" * 3000 + "}",
    '{"name": ["f"], "arguments": {}}',
])
def test_outputs_that_cannot_be_calls_stay_content(text: str) -> None:
    parsed = parse_tool_calls(text, ["f"])
    assert parsed.calls == [] and parsed.content == text
    delta, calls = ToolCallStream(["f"], forced=False).feed(text, finished=True)
    assert calls == [] and delta == text


@pytest.mark.parametrize("arguments", [
    '{"x": "\\ud800"}', '{"a":' * 2000 + "1" + "}" * 2000,
])
def test_arguments_a_client_can_steer_are_carried_as_written(arguments: str) -> None:
    """A call's arguments are the text the model wrote (no parse, no recursion), which any
    response can carry: an escaped lone surrogate or deep nesting stay text for the client."""
    for text in ('{"name": "f", "arguments": ' + arguments + "}",
                 '<tool_call>{"name": "f", "arguments": ' + arguments + "}</tool_call>"):
        parsed = parse_tool_calls(text, ["f"])
        assert [c.arguments for c in parsed.calls] == [arguments] and parsed.content is None
        assert orjson.loads(orjson.dumps(parsed.calls[0].to_openai()))["function"]["arguments"] == arguments
