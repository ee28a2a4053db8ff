"""The Messages API without a model: body checks naming the field, the conversation handed to
the chat template, the events of fake outputs (streamed and folded into the plain answer), and
the routes in-process (Anthropic's error shape, x-api-key, the browser guard)."""

from __future__ import annotations

import asyncio
import json
from typing import Any, ClassVar

import pytest
from aiohttp.test_utils import TestClient, TestServer

from runtime.contracts.config import ServerConfig
from runtime.contracts.errors import InvalidRequest
from tokenizer.anthropic.events import MessageEvents, final_message
from tokenizer.anthropic.request import check_messages, translate
from tokenizer.http_server import create_app
from tokenizer.server_state import ServerState

TOOL = {"name": "get_weather", "input_schema": {"type": "object", "properties": {
    "city": {"type": "string"}}, "required": ["city"]}}
ASK = [{"role": "user", "content": "hi"}]


def _plan(**extra: Any) -> Any:
    return check_messages({"model": "m", "max_tokens": 8, "messages": ASK, **extra})


def _out(text: str, completion: int, finish: dict[str, Any] | None = None) -> dict[str, Any]:
    meta = {"prompt_tokens": 10, "completion_tokens": completion, "cached_tokens": 4,
            "finish_reason": finish}
    return {"text": text, "meta_info": meta}


def _stream(plan: Any, texts: list[str], finish: dict[str, Any]) -> list[dict[str, Any]]:
    events = MessageEvents(plan, "smol", "auto")
    out: list[dict[str, Any]] = []
    for i, text in enumerate(texts):
        last = i == len(texts) - 1
        out += events.feed(_out(text, i + 1, finish if last else None))
    return out


def test_the_conversation_is_the_chat_pipelines_messages() -> None:
    plan = _plan(system=[{"type": "text", "text": "Be brief."}], tools=[TOOL], messages=[
        *ASK, {"role": "assistant", "content": [
            {"type": "text", "text": "Let me look."},
            {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}}]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "18C"}]},
            {"type": "text", "text": "Thanks"}]}], stop_sequences=["\n\n"], temperature=0)
    assert plan.conversation.messages == [
        {"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "Let me look.", "tool_calls": [{
            "id": "toolu_1", "type": "function",
            "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
        {"role": "tool", "content": "18C", "tool_call_id": "toolu_1"},
        {"role": "user", "content": "Thanks"}]
    assert plan.sampling == {"max_new_tokens": 8, "temperature": 0, "stop": ["\n\n"]}
    assert plan.conversation.tools.plan is not None and not plan.conversation.tools.grammar


def test_forced_and_disabled_tool_choices() -> None:
    forced = _plan(tools=[TOOL], tool_choice={"type": "tool", "name": "get_weather"})
    schema = json.loads(forced.sampling["json_schema"])
    assert schema["properties"]["name"] == {"const": "get_weather"}
    assert _plan(tools=[TOOL], tool_choice={"type": "any"}).sampling["json_schema"]
    none = _plan(tools=[TOOL], tool_choice={"type": "none"})
    assert none.conversation.tools.plan is None and "json_schema" not in none.sampling


def test_manager_errors_get_this_apis_names() -> None:
    exc = translate(InvalidRequest("max_new_tokens must be at most 5", param="sampling_params.max_new_tokens"))
    assert (exc.param, exc.message) == ("max_tokens", "max_tokens must be at most 5")
    assert translate(InvalidRequest("stop strings must be non-empty", param="stop")).param == "stop_sequences"


def test_text_streams_in_anthropics_order_and_folds_to_the_plain_answer() -> None:
    plan = _plan(stop_sequences=["!"])
    events = _stream(plan, ["He", "Hello", "Hello there"], {"type": "stop", "matched": "!"})
    assert [e["type"] for e in events] == [
        "message_start", "ping", "content_block_start", "content_block_delta", "content_block_delta",
        "content_block_delta", "content_block_stop", "message_delta", "message_stop"]
    assert "".join(e["delta"]["text"] for e in events if e["type"] == "content_block_delta") == "Hello there"
    assert events[-2]["delta"] == {"stop_reason": "stop_sequence", "stop_sequence": "!"}
    assert events[-2]["usage"] == {"input_tokens": 6, "output_tokens": 3,
                                   "cache_creation_input_tokens": 0, "cache_read_input_tokens": 4}
    plain = final_message(plan, "smol", _out("Hello there", 3, {"type": "stop", "matched": "!"}), "auto")
    assert plain["content"] == [{"type": "text", "text": "Hello there"}]
    assert (plain["stop_reason"], plain["model"], plain["id"]) == ("stop_sequence", "smol", plan.id)


@pytest.mark.parametrize("finish, reason", [({"type": "stop", "matched": 2}, "end_turn"),
                                            ({"type": "length"}, "max_tokens"),
                                            ({"type": "abort"}, "pause_turn")])
def test_stop_reasons(finish: dict[str, Any], reason: str) -> None:
    plain = final_message(_plan(), "m", _out("", 0, finish), "auto")
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
    plain = final_message(plan, "m", _out(call, 3, {"type": "stop", "matched": 2}), "auto")
    assert [(b["type"], b["name"], b["input"]) for b in plain["content"]] == [
        ("tool_use", "get_weather", {"city": "Paris"})]


def test_text_then_calls_in_order_and_disable_parallel_tool_use_keeps_one() -> None:
    call = '<tool_call>{"name": "get_weather", "arguments": {"city": "%s"}}</tool_call>'
    text = "Checking." + call % "Paris" + call % "Rome"
    done = {"type": "stop", "matched": 2}
    for choice, cities in (({"type": "auto"}, ["Paris", "Rome"]),
                           ({"type": "auto", "disable_parallel_tool_use": True}, ["Paris"])):
        plan = _plan(tools=[TOOL], tool_choice=choice)
        blocks = final_message(plan, "m", _out(text, 9, done), "hermes")["content"]
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
    ({"max_tokens": 8, "messages": ASK, "thinking": {"type": "enabled", "budget_tokens": 1024}}, "thinking"),
]


@pytest.mark.parametrize("body, param", BAD)
def test_bad_bodies_name_the_field(body: dict[str, Any], param: str) -> None:
    with pytest.raises(InvalidRequest) as info:
        check_messages({"model": "m", **body})
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
