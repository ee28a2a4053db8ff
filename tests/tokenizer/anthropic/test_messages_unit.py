"""The Messages API without a model (tokenizer/anthropic/messages.py): body checks naming the
field, the conversation handed to the chat template, the events of fake outputs (streamed and
folded into the plain answer), and the routes in-process (Anthropic's error shape, x-api-key,
the browser guard)."""

from __future__ import annotations

import asyncio
import json
from typing import Any, ClassVar

import orjson
import pytest
from aiohttp.test_utils import TestClient, TestServer

from runtime.contracts.config import ServerConfig
from runtime.contracts.errors import InvalidRequest
from tokenizer.anthropic.messages import MessageAnswer, MessagesRequest, parse_count, parse_messages
from tokenizer.core.choices import ChoiceReader
from tokenizer.core.events import Finished, Tokens, Update, Usage
from tokenizer.core.request import ChatInput
from tokenizer.http_server import create_app
from tokenizer.server_state import ServerState

TOOL = {"name": "get_weather", "input_schema": {"type": "object", "properties": {
    "city": {"type": "string"}}, "required": ["city"]}}
ASK = [{"role": "user", "content": "hi"}]
DEEP_LIST = orjson.loads("[" * 1000 + "]" * 1000)


def _plan(parser: str = "auto", **extra: Any) -> MessagesRequest:
    body = {"model": "m", "max_tokens": 8, "messages": ASK, **extra}
    return parse_messages(body, ServerConfig(tool_call_parser=parser), "smol")


def _chat(plan: MessagesRequest) -> ChatInput:
    chat = plan.req.prompts[0].prompt
    assert isinstance(chat, ChatInput)
    return chat


def _updates(plan: MessagesRequest, texts: list[str], finish: dict[str, Any]) -> list[Update]:
    """The core's updates of an output that grew through `texts` (cumulative), then finished."""
    reader = ChoiceReader(0, plan.req.read)
    updates, sent = [], ""
    for i, text in enumerate(texts):
        last = i == len(texts) - 1
        usage = Usage(10, i + 1, 4)
        events = [*reader.read(text[len(sent):], last), Tokens(0, [1], None, None, usage)]
        if last:
            events.append(Finished(0, finish, usage, "r", 0.0))
        updates.append(Update(0, events))
        sent = text
    return updates


def _stream(plan: MessagesRequest, texts: list[str], finish: dict[str, Any]) -> list[dict[str, Any]]:
    answer = MessageAnswer(plan)
    out: list[dict[str, Any]] = answer.start()
    for update in _updates(plan, texts, finish):
        out += answer.update(update)
    return out + answer.end()


def _final(plan: MessagesRequest, text: str, finish: dict[str, Any]) -> dict[str, Any]:
    answer = MessageAnswer(plan)
    for update in _updates(plan, [text], finish):
        answer.update(update)
    return answer.final()


def test_the_conversation_is_the_chat_pipelines_messages() -> None:
    messages = [
        *ASK, {"role": "assistant", "content": [
            {"type": "text", "text": "Let me look."},
            {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}}]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "18C"}]},
            {"type": "text", "text": "Thanks"}]}]
    plan = _plan(system=[{"type": "text", "text": "Be brief."}], tools=[TOOL], messages=messages,
                 stop_sequences=["\n\n"], temperature=0)
    expected = [
        {"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "Let me look.", "tool_calls": [{
            "id": "toolu_1", "type": "function",
            "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
        {"role": "tool", "content": "18C", "tool_call_id": "toolu_1"},
        {"role": "user", "content": "Thanks"}]
    assert _chat(plan).messages == expected
    assert plan.req.prompts[0].sampling == {"max_new_tokens": 8, "temperature": 0, "stop": ["\n\n"]}
    assert plan.req.read.tools is not None and _chat(plan).tools == plan.req.read.tools
    assert plan.req.read.call_id_prefix == "toolu_"
    count = parse_count({"model": "m", "system": "Be brief.", "tools": [TOOL], "messages": messages})
    assert count.messages == expected and count.tools is not None  # count_tokens renders the same


def test_forced_and_disabled_tool_choices() -> None:
    forced = _plan(tools=[TOOL], tool_choice={"type": "tool", "name": "get_weather"})
    schema = json.loads(forced.req.prompts[0].sampling["json_schema"])
    assert schema["properties"]["name"] == {"const": "get_weather"}
    assert _plan(tools=[TOOL], tool_choice={"type": "any"}).req.prompts[0].sampling["json_schema"]
    none = _plan(tools=[TOOL], tool_choice={"type": "none"})
    assert none.req.read.tools is None and "json_schema" not in none.req.prompts[0].sampling


def test_manager_errors_get_this_apis_names() -> None:
    names = _plan().req.names
    exc = InvalidRequest.field("max_new_tokens", "must be at most 5").renamed(names)
    assert (exc.param, exc.message) == ("max_tokens", "max_tokens: must be at most 5")
    assert InvalidRequest.field("stop", "stop strings must be non-empty").renamed(names).param == "stop_sequences"


def test_text_streams_in_anthropics_order_and_folds_to_the_plain_answer() -> None:
    plan = _plan(stop_sequences=["!"])
    events = _stream(plan, ["He", "Hello", "Hello there"], {"type": "stop", "matched": "!"})
    assert [e["type"] for e in events] == [
        "message_start", "ping", "content_block_start", "content_block_delta", "content_block_delta",
        "content_block_delta", "content_block_stop", "message_delta", "message_stop"]
    assert events[0]["message"]["id"] == plan.id and events[0]["message"]["model"] == "smol"
    assert "".join(e["delta"]["text"] for e in events if e["type"] == "content_block_delta") == "Hello there"
    assert events[-2]["delta"] == {"stop_reason": "stop_sequence", "stop_sequence": "!"}
    assert events[-2]["usage"] == {"input_tokens": 6, "output_tokens": 3,
                                   "cache_creation_input_tokens": 0, "cache_read_input_tokens": 4}
    plain = _final(plan, "Hello there", {"type": "stop", "matched": "!"})
    assert plain["content"] == [{"type": "text", "text": "Hello there"}]
    assert (plain["stop_reason"], plain["model"], plain["id"]) == ("stop_sequence", "smol", plan.id)


@pytest.mark.parametrize("finish, reason", [({"type": "stop", "matched": 2}, "end_turn"),
                                            ({"type": "length"}, "max_tokens"),
                                            ({"type": "abort"}, "pause_turn")])
def test_stop_reasons(finish: dict[str, Any], reason: str) -> None:
    plain = _final(_plan(), "", finish)
    assert plain["stop_reason"] == reason and plain["content"] == [{"type": "text", "text": ""}]


def test_a_forced_call_streams_as_tool_use_with_input_json_deltas() -> None:
    plan = _plan(tools=[TOOL], tool_choice={"type": "tool", "name": "get_weather"})
    call = '{"name": "get_weather", "arguments": {"city": "Paris"}}'
    events = _stream(plan, [call[:10], call[:40], call], {"type": "stop", "matched": 2})
    start = next(e for e in events if e["type"] == "content_block_start")["content_block"]
    assert start["type"] == "tool_use" and start["id"].startswith("toolu_") and start["input"] == {}
    args = "".join(e["delta"]["partial_json"] for e in events if e["type"] == "content_block_delta")
    assert json.loads(args) == {"city": "Paris"}
    assert events[-2]["delta"]["stop_reason"] == "tool_use"
    plain = _final(plan, call, {"type": "stop", "matched": 2})
    assert [(b["type"], b["name"], b["input"]) for b in plain["content"]] == [
        ("tool_use", "get_weather", {"city": "Paris"})]


def test_text_then_calls_in_order_and_disable_parallel_tool_use_keeps_one() -> None:
    call = '<tool_call>{"name": "get_weather", "arguments": {"city": "%s"}}</tool_call>'
    text = "Checking." + call % "Paris" + call % "Rome"
    done = {"type": "stop", "matched": 2}
    for choice, cities in (({"type": "auto"}, ["Paris", "Rome"]),
                           ({"type": "auto", "disable_parallel_tool_use": True}, ["Paris"])):
        plan = _plan("hermes", tools=[TOOL], tool_choice=choice)
        blocks = _final(plan, text, done)["content"]
        assert blocks[0] == {"type": "text", "text": "Checking."}
        assert [b["input"]["city"] for b in blocks[1:]] == cities
        assert len({b["id"] for b in blocks[1:]}) == len(cities)
        events = _stream(plan, [text[:12], text[:50], text], done)
        starts = [e["content_block"]["type"] for e in events if e["type"] == "content_block_start"]
        assert starts == ["text", *["tool_use"] * len(cities)]


BAD = [
    ({"messages": ASK}, "max_tokens"),
    ({"max_tokens": True, "messages": ASK}, "max_tokens"),
    ({"max_tokens": 8}, "messages"),
    ({"max_tokens": 8, "messages": [{"role": "system", "content": "x"}]}, "messages.0.role"),
    ({"max_tokens": 8, "messages": [*ASK, {"role": "assistant", "content": "x"}]}, "messages.1.role"),
    ({"max_tokens": 8, "messages": [{"role": "user", "content": [{"type": "thinking"}]}]},
     "messages.0.content.0.type"),
    ({"max_tokens": 8, "messages": [{"role": "user", "content": [{"type": "text", "text": 1}]}]},
     "messages.0.content.0.text"),
    ({"max_tokens": 8, "messages": ASK, "system": 5}, "system"),
    ({"max_tokens": 8, "messages": ASK, "tools": [{"name": "x"}]}, "tools.0.input_schema"),
    ({"max_tokens": 8, "messages": ASK, "tool_choice": {"type": "any"}}, "tool_choice"),
    ({"max_tokens": 8, "messages": ASK, "tool_choice": "auto"}, "tool_choice"),
    ({"max_tokens": 8, "messages": ASK, "stop_sequences": "x"}, "stop_sequences"),
    ({"max_tokens": 8, "messages": ASK, "metadata": {"user": "x"}}, "metadata.user"),
    ({"max_tokens": 8, "messages": ASK, "thinking": {"type": "enabled", "budget_tokens": 1024}}, "thinking.type"),
    ({"max_tokens": 8, "messages": ASK, "tools": [{"name": "x", "input_schema": {"type": "array"}}]},
     "tools.0.input_schema"),
    ({"max_tokens": 8, "messages": [{"role": DEEP_LIST, "content": "x"}]}, "messages.0.role"),
    ({"max_tokens": 8, "messages": [{"role": "user", "content": [{"type": DEEP_LIST}]}]},
     "messages.0.content.0.type"),
    ({"max_tokens": 8, "messages": [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t"}]}]},
     "messages.0.content.0.tool_use_id"),
]


@pytest.mark.parametrize("body, param", BAD)
def test_bad_bodies_name_the_field(body: dict[str, Any], param: str) -> None:
    with pytest.raises(InvalidRequest) as info:
        parse_messages({"model": "m", **body}, ServerConfig(), "smol")
    assert info.value.param == param and info.value.message.startswith(param), info.value.message


# ---------------------------------------------------------------- routes, in-process


class Manager:
    """What the app reads from a TokenizerManager before any generation."""

    dead_reason: str | None = None
    is_healthy = True
    on_output = None
    on_reject = None
    vocab_size = 1000
    context_length = 512
    scheduler_info: ClassVar[dict[str, int]] = {"max_total_tokens": 256}


def _post(config: ServerConfig, body: Any, headers: dict[str, str]) -> tuple[int, Any]:
    async def run() -> tuple[int, Any]:
        server = ServerState(config)
        server.attach(Manager())  # type: ignore[arg-type]
        async with TestClient(TestServer(create_app(server))) as client:
            resp = await client.post("/v1/messages", json=body, headers=headers)
            return resp.status, await resp.json()

    return asyncio.run(run())


def test_errors_take_anthropics_shape_and_x_api_key_is_a_key() -> None:
    keyed = ServerConfig(api_key="k")
    status, body = _post(keyed, {"model": "m", "messages": ASK}, {"x-api-key": "wrong"})
    assert status == 401 and body["type"] == "error" and body["error"]["type"] == "authentication_error"
    status, body = _post(keyed, {"model": "m", "messages": ASK}, {"x-api-key": "k"})
    assert status == 400 and body == {"type": "error", "error": {
        "type": "invalid_request_error", "message": body["error"]["message"]}}
    assert body["error"]["message"].startswith("max_tokens: ")
    status, body = _post(ServerConfig(), {}, {"Origin": "https://evil.example"})
    assert status == 403 and body["error"]["type"] == "permission_error"
