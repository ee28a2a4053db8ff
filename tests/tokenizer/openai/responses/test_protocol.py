"""Responses requests into the chat pipeline, and the event scan, without a server."""

from __future__ import annotations

import json

import pytest

from runtime.contracts.errors import InvalidRequest
from tokenizer.openai.constraints import ToolChoice, ToolPlan
from tokenizer.openai.protocol import check_chat
from tokenizer.openai.reasoning import PARSERS
from tokenizer.openai.responses import protocol, tools
from tokenizer.openai.responses.events import ResponseEvents, items_of
from tokenizer.openai.responses.schema import request_schemas, tool_schema
from tokenizer.openapi_bodies import SchemaLimits

TOOL = {"type": "function", "name": "f", "parameters": {"type": "object", "properties": {}}}
PLAN = ToolPlan([{"name": "f", "parameters": {"type": "object", "properties": {}}}], ToolChoice("auto"))


def _chat(body: dict, history: list | None = None) -> dict:
    req = protocol.check_response({"model": "m", **body}, reasoning_parser=False)
    return req.chat_request(history or [])


def test_items_become_chat_messages_with_calls_joined_to_their_turn() -> None:
    chat = _chat({"instructions": "Be brief.", "input": [
        {"role": "user", "content": [{"type": "input_text", "text": "a"}, {"type": "input_text", "text": "b"}]},
        {"type": "message", "role": "assistant", "id": "msg_1", "status": "completed",
         "content": [{"type": "output_text", "text": "calling", "annotations": []}]},
        {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}", "id": "fc_1"},
        {"type": "function_call_output", "call_id": "c1", "output": "ok"},
        {"type": "reasoning", "id": "rs_1", "summary": []}]})
    assert [m["role"] for m in chat["messages"]] == ["system", "user", "assistant", "tool"]
    assert chat["messages"][1]["content"] == "ab"
    assert chat["messages"][2]["tool_calls"][0]["id"] == "c1"
    check_chat(chat, 20)  # the chat pipeline takes what this built


def test_fields_map_to_chat_names_and_errors_map_back() -> None:
    chat = _chat({"input": "hi", "tools": [TOOL], "tool_choice": {"type": "function", "name": "f"},
                  "max_output_tokens": 5, "text": {"format": {"type": "json_object"}}, "parallel_tool_calls": False})
    assert chat["tool_choice"] == {"type": "function", "function": {"name": "f"}}
    assert chat["max_tokens"] == 5 and chat["response_format"] == {"type": "json_object"}
    assert chat["tools"][0]["function"]["name"] == "f" and chat["parallel_tool_calls"] is False
    renamed = protocol.rename_error(InvalidRequest("tools[0].function.name is bad", param="tools[0].function.name"))
    assert renamed.param == "tools[0].name"
    renamed = protocol.rename_error(InvalidRequest("max_tokens too big", param="max_tokens"))
    assert renamed.param == "max_output_tokens" and "max_output_tokens" in renamed.message
    assert protocol.rename_error(InvalidRequest("x", param="messages[3].content")).param == "input"


def test_previous_history_comes_before_the_new_items() -> None:
    history = [{"type": "message", "role": "user", "content": "first"},
               {"type": "message", "role": "assistant", "content": "answer"}]
    chat = _chat({"input": "second"}, history)
    assert [m["content"] for m in chat["messages"]] == ["first", "answer", "second"]


@pytest.mark.parametrize(("body", "param"), [
    ({"input": "x", "background": True}, "background"),
    ({"input": "x", "stream_options": {"include_obfuscation": True}}, "stream_options"),
    ({"input": "x", "truncation": "middle"}, "truncation"),
    ({"input": [{"type": "item_reference", "id": "x"}]}, "input[0].type"),
    ({"input": [{"role": "user", "content": "x", "extra": 1}]}, "input[0].extra"),
])
def test_refused_fields_are_named(body: dict, param: str) -> None:
    with pytest.raises(InvalidRequest) as error:
        _chat(body)
    assert error.value.param == param


def test_streamed_events_carry_the_same_items_as_the_whole_output() -> None:
    text = 'Sure. <tool_call>{"name": "f", "arguments": {"a": 1}}</tool_call>'  # content, then a call
    response = {"id": "resp_1"}
    stream = ResponseEvents(response, PARSERS["qwen3"], PLAN, "auto")
    events = stream.start()
    whole = "<think>hmm</think>" + text
    for end in range(1, len(whole) + 1):
        events += stream.feed(whole[:end], end == len(whole))
    kinds = [e["type"] for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert [i["type"] for i in stream.items] == ["reasoning", "message", "function_call"]
    again = items_of(whole, "completed", PARSERS["qwen3"], PLAN, "auto")
    strip = [{k: v for k, v in i.items() if k not in ("id", "call_id")} for i in stream.items]
    assert strip == [{k: v for k, v in i.items() if k not in ("id", "call_id")} for i in again]
    args = "".join(e["delta"] for e in events if e["type"] == "response.function_call_arguments.delta")
    assert json.loads(args) == {"a": 1} and stream.items[1]["content"][0]["text"] == "Sure. "


def test_an_empty_output_is_one_empty_message() -> None:
    assert [i["content"][0]["text"] for i in items_of("", "completed", None, None, "auto")] == [""]


def test_the_document_lists_the_validators_fields() -> None:
    lim = SchemaLimits(token_budget=64, vocab_size=100, max_n=1, max_top_logprobs=1, max_prompts=1, api_key=False)
    assert set(request_schemas(lim)["ResponseRequest"]["properties"]) == protocol.FIELDS
    assert set(tool_schema()["properties"]) == tools.TOOL_KEYS


@pytest.mark.parametrize("field", ["text", "tool_choice", "reasoning", "metadata", "tools", "input", "stream_options"])
@pytest.mark.parametrize("value", ["abc", 3, [1], {"x": 1}, True])
def test_wrong_shapes_are_400s_never_crashes(field: str, value: object) -> None:
    try:
        check_chat(_chat({"input": "hi", field: value}), 20)
    except InvalidRequest as exc:
        param = protocol.rename_error(exc).param
        assert param is not None and param.startswith(field), (field, value, param)
