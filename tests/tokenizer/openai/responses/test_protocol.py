"""Responses requests into the typed request (tokenizer/openai/responses/request.py), and the
answer's items and events folded from the core's events (answer.py), without a server."""

from __future__ import annotations

import asyncio
import json
import types
from typing import Any

import pytest

from runtime.contracts.config import ServerConfig
from runtime.contracts.errors import InvalidRequest
from tokenizer.core.choices import ChoiceReader
from tokenizer.core.events import Finished, Tokens, Update, Usage
from tokenizer.core.pipeline import generate
from tokenizer.core.reasoning import PARSERS
from tokenizer.core.request import ChatInput, GenRequest, ReadOptions
from tokenizer.core.tools import ToolChoice, ToolPlan
from tokenizer.limits import RequestLimits
from tokenizer.openai.chat import parse_chat
from tokenizer.openai.responses.answer import ResponseAnswer
from tokenizer.openai.responses.output import new_response
from tokenizer.openai.responses.request import ResponseRequest, parse_response
from tokenizer.openai.responses.spec import FunctionTool, ResponseBody
from tokenizer.openapi import document

TOOL = {"type": "function", "name": "f", "parameters": {"type": "object", "properties": {}}}
LIMITS = RequestLimits(vocab_size=100, context_length=64, kv_total=None, max_n=1, max_top_logprobs=1)
PLAN = ToolPlan([{"name": "f", "parameters": {"type": "object", "properties": {}}}], ToolChoice("auto"))


def _parsed(body: dict[str, Any]) -> ResponseRequest:
    return parse_response({"model": "m", **body}, ServerConfig())


def _request(body: dict[str, Any], history: list[dict[str, Any]] | None = None) -> GenRequest:
    return _parsed(body).request(history or [], "resp_1")


def _messages(req: GenRequest) -> list[dict[str, Any]]:
    chat = req.prompts[0].prompt
    assert isinstance(chat, ChatInput)
    return chat.messages


def test_items_become_chat_messages_with_calls_joined_to_their_turn() -> None:
    messages = _messages(_request({"instructions": "Be brief.", "input": [
        {"role": "user", "content": [{"type": "input_text", "text": "a"}, {"type": "input_text", "text": "b"}]},
        {"type": "message", "role": "assistant", "id": "msg_1", "status": "completed",
         "content": [{"type": "output_text", "text": "calling", "annotations": []}]},
        {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}", "id": "fc_1"},
        {"type": "function_call_output", "call_id": "c1", "output": "ok"},
        {"type": "reasoning", "id": "rs_1", "summary": []}]}))
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "tool"]
    assert messages[1]["content"] == "ab"
    assert messages[2]["tool_calls"][0]["id"] == "c1"
    parse_chat({"model": "m", "messages": messages}, ServerConfig(), "m")  # chat messages, as chat takes them


def test_fields_map_to_the_request_and_errors_map_back() -> None:
    req = _request({"input": "hi", "tools": [TOOL], "tool_choice": {"type": "function", "name": "f"},
                    "max_output_tokens": 5, "parallel_tool_calls": False})
    plan = req.read.tools
    assert plan is not None and plan.choice == ToolChoice("named", "f") and not plan.parallel
    assert plan.names == ["f"] and req.prompts[0].sampling["max_new_tokens"] == 5
    assert json.loads(req.prompts[0].sampling["json_schema"])["properties"]["name"] == {"const": "f"}
    fmt = _request({"input": "hi", "text": {"format": {"type": "json_object"}}})
    assert fmt.prompts[0].sampling["json_schema"] == "$$ANY$$"
    with pytest.raises(InvalidRequest) as info:
        _request({"input": "hi", "tools": [TOOL], "tool_choice": "required",
                  "text": {"format": {"type": "json_object"}}})
    assert info.value.param == "tool_choice"
    with pytest.raises(InvalidRequest) as info:
        _request({"input": "hi", "tools": [{**TOOL, "name": "a b"}]})
    assert info.value.param == "tools[0].name"
    renamed = InvalidRequest.field("max_new_tokens", "too big").renamed(req.names)
    assert renamed.param == "max_output_tokens" and renamed.message.startswith("max_output_tokens:")
    assert InvalidRequest("bad", param="messages").renamed(req.names).param == "input"
    assert fmt.names["json_schema"] == "text.format" and req.names["json_schema"] == "tools"


def test_a_template_error_names_input() -> None:
    """The chat template's errors (param messages) are named as this API calls the field."""

    def broken(messages: list[dict[str, Any]], tools: Any = None, **variables: Any) -> str:
        raise ValueError("roles must alternate")

    async def encode_texts(texts: list[str], add_special_tokens: bool = True) -> list[list[int]]:
        return [[1] for _ in texts]

    tm = types.SimpleNamespace(tokenizer=types.SimpleNamespace(chat_template="{{ messages }}"),
                               encoder=types.SimpleNamespace(encode_texts=encode_texts), limits=LIMITS,
                               apply_chat_template=broken)
    with pytest.raises(InvalidRequest) as info:
        asyncio.run(generate(tm, _request({"input": "hi"})))  # type: ignore[arg-type]
    assert info.value.param == "input" and "roles must alternate" in info.value.message


def test_previous_history_comes_before_the_new_items() -> None:
    history = [{"type": "message", "role": "user", "content": "first"},
               {"type": "message", "role": "assistant", "content": "answer"}]
    assert [m["content"] for m in _messages(_request({"input": "second"}, history))] == ["first", "answer", "second"]


@pytest.mark.parametrize(("body", "param"), [
    ({"input": "x", "background": True}, "background"),
    ({"input": "x", "stream_options": {"include_obfuscation": True}}, "stream_options"),  # without stream
    ({"input": "x", "stream": True, "stream_options": {"x": 1}}, "stream_options.x"),
    ({"input": "x", "truncation": "middle"}, "truncation"),
    ({"input": [{"type": "item_reference", "id": "x"}]}, "input[0].type"),
    ({"input": [{"type": ["message"], "role": "user", "content": "x"}]}, "input[0].type"),
    ({"input": "x", "reasoning": {"effort": "low"}}, "reasoning.effort"),  # no --reasoning-parser
])
def test_refused_fields_are_named(body: dict[str, Any], param: str) -> None:
    with pytest.raises(InvalidRequest) as error:
        _request(body)
    assert error.value.param == param and error.value.message.startswith(param)


def _updates(text: str, cuts: list[int], read: ReadOptions) -> list[Update]:
    """The core's updates of one output fed in pieces ending at `cuts`."""
    reader = ChoiceReader(0, read)
    usage = Usage(3, 1, 0)
    updates = []
    for start, end in zip([0, *cuts], cuts):
        done = end == len(text)
        events = [*reader.read(text[start:end], done), Tokens(0, [1], None, None, usage)]
        if done:
            events.append(Finished(0, {"type": "stop"}, usage, "r", 0.0))
        updates.append(Update(0, events))
    return updates


def _answer(stream: bool) -> ResponseAnswer:
    return ResponseAnswer(new_response("resp_1", "m", _parsed({"input": "hi"}).echo), stream)


def test_streamed_events_carry_the_same_items_as_the_whole_output() -> None:
    text = 'Sure. <tool_call>{"name": "f", "arguments": {"a": 1}}</tool_call>'  # content, then a call
    whole = "<think>hmm</think>" + text
    read = ReadOptions(PARSERS["qwen3"], True, PLAN, "auto")
    stream = _answer(stream=True)
    events = stream.start()
    for update in _updates(whole, list(range(1, len(whole) + 1)), read):
        events += stream.update(update)
    events += stream.end()
    kinds = [e["type"] for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"] and kinds[-1] == "response.completed"
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert [i["type"] for i in stream.items] == ["reasoning", "message", "function_call"]
    again = _answer(stream=False)
    for update in _updates(whole, [len(whole)], read):
        again.update(update)

    def strip(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [{k: v for k, v in i.items() if k not in ("id", "call_id")} for i in items]

    assert strip(stream.final()["output"]) == strip(again.final()["output"])
    args = "".join(e["delta"] for e in events if e["type"] == "response.function_call_arguments.delta")
    assert json.loads(args) == {"a": 1} and stream.items[1]["content"][0]["text"] == "Sure. "
    assert stream.items[0]["content"][0]["text"] == "hmm"


def test_an_empty_output_is_one_empty_message() -> None:
    answer = _answer(stream=False)
    answer.update(Update(0, [Tokens(0, [], None, None, Usage(3, 0, 0)),
                             Finished(0, {"type": "stop"}, Usage(3, 0, 0), "r", 0.0)]))
    assert [i["content"][0]["text"] for i in answer.final()["output"]] == [""]


def test_the_document_lists_the_validators_fields() -> None:
    schemas = document()["components"]["schemas"]
    for name, model in (("ResponseRequest", ResponseBody), ("FunctionTool", FunctionTool)):
        assert set(schemas[name]["properties"]) == {f.alias or k for k, f in model.model_fields.items()}


@pytest.mark.parametrize("field", ["text", "tool_choice", "reasoning", "metadata", "tools", "input", "stream_options"])
@pytest.mark.parametrize("value", ["abc", 3, [1], {"x": 1}, True])
def test_wrong_shapes_are_400s_never_crashes(field: str, value: object) -> None:
    try:
        _request({"input": "hi", field: value})
    except InvalidRequest as exc:
        assert exc.param is not None and exc.param.startswith(field), (field, value, exc.param)
