"""The Messages API against the real server (the run's `shared_server`: the default model) through
Anthropic's own client, unmodified: a message, its stream, a forced tool call and its result,
count_tokens, the prefix cache, and bad bodies answered in Anthropic's error shape. Greedy and
short, so the whole module takes a few seconds of generation."""

from __future__ import annotations

import json
from typing import Any

import anthropic
import jsonschema_rs
import pytest
import requests

from tests.tokenizer.http_helpers import RunningServer, post

pytestmark = pytest.mark.slow

WEATHER = {"name": "get_weather", "description": "Get the current weather in a city",
           "input_schema": {"type": "object", "additionalProperties": False, "required": ["city"],
                            "properties": {"city": {"type": "string", "maxLength": 20}}}}
ASK = [{"role": "user", "content": "Name three colors."}]
ASK_WEATHER = [{"role": "user", "content": "What is the weather like in Paris?"}]
# NOTE: the client has no sampling arguments (Claude's newer models take none): they go in the body.
GREEDY: Any = {"model": "m", "max_tokens": 12, "extra_body": {"temperature": 0}}
RAW_GREEDY = {"model": "m", "max_tokens": 12, "temperature": 0}
EVENT_ORDER = ["message_start", "ping", "content_block_start", "content_block_delta",
               "content_block_stop", "message_delta", "message_stop"]


@pytest.fixture(scope="module")
def server(shared_server: RunningServer) -> RunningServer:
    return shared_server


@pytest.fixture(scope="module")
def client(server: RunningServer) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=server.url, api_key="x", max_retries=0, timeout=120)


def _event_names(server: RunningServer, body: dict[str, Any]) -> list[str]:
    """The `event:` names of a raw stream, consecutive repeats folded."""
    resp = post(server, "/v1/messages", {**body, "stream": True}, stream=True)
    assert resp.status_code == 200 and resp.headers["Content-Type"].startswith("text/event-stream")
    names: list[str] = []
    for line in resp.iter_lines():
        name = line.decode().removeprefix("event: ") if line.startswith(b"event: ") else None
        if name is not None and (not names or names[-1] != name):
            names.append(name)
    return names


def test_create_stream_and_count_tokens_agree(server: RunningServer, client: anthropic.Anthropic) -> None:
    plain = client.messages.create(messages=ASK, system="Answer briefly.", **GREEDY)
    assert plain.type == "message" and plain.role == "assistant" and plain.id.startswith("msg_")
    assert [b.type for b in plain.content] == ["text"] and plain.content[0].text
    assert plain.stop_reason in ("end_turn", "max_tokens")
    assert 0 < plain.usage.output_tokens <= 12
    with client.messages.stream(messages=ASK, system="Answer briefly.", **GREEDY) as stream:
        streamed = stream.get_final_message()
    assert streamed.content[0].text == plain.content[0].text  # type: ignore[union-attr]
    assert streamed.stop_reason == plain.stop_reason
    assert streamed.usage.output_tokens == plain.usage.output_tokens
    assert _event_names(server, {"messages": ASK, "system": "Answer briefly.", **RAW_GREEDY}) == EVENT_ORDER
    count = client.messages.count_tokens(model="m", messages=ASK, system="Answer briefly.")
    prompt = plain.usage.input_tokens + (plain.usage.cache_read_input_tokens or 0)
    assert count.input_tokens == prompt > 5


def test_stop_sequences_end_the_message(client: anthropic.Anthropic) -> None:
    first = client.messages.create(messages=ASK, **GREEDY).content[0].text  # type: ignore[union-attr]
    word = first.split()[0]
    out = client.messages.create(messages=ASK, stop_sequences=[word], **GREEDY)
    assert out.stop_reason == "stop_sequence" and out.stop_sequence == word
    assert word not in out.content[0].text  # type: ignore[union-attr]


def test_forced_tool_use_then_tool_result(client: anthropic.Anthropic) -> None:
    kwargs: Any = {**GREEDY, "max_tokens": 32, "tools": [WEATHER],
                   "tool_choice": {"type": "tool", "name": "get_weather"}}
    out = client.messages.create(messages=ASK_WEATHER, **kwargs)
    assert out.stop_reason == "tool_use" and [b.type for b in out.content] == ["tool_use"]
    call = out.content[0]
    assert call.type == "tool_use" and call.name == "get_weather" and call.id.startswith("toolu_")
    jsonschema_rs.validate(WEATHER["input_schema"], call.input)
    with client.messages.stream(messages=ASK_WEATHER, **kwargs) as stream:
        streamed = stream.get_final_message()
    assert streamed.stop_reason == "tool_use" and streamed.content[0].input == call.input  # type: ignore[union-attr]
    history: Any = [*ASK_WEATHER, {"role": "assistant", "content": out.content},
                    {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id,
                                                  "content": json.dumps({"temperature": 18})}]}]
    reply = client.messages.create(messages=history, tools=[WEATHER], **GREEDY)
    assert reply.stop_reason in ("end_turn", "max_tokens", "tool_use") and reply.content
    assert reply.usage.input_tokens + (reply.usage.cache_read_input_tokens or 0) > \
        out.usage.input_tokens + (out.usage.cache_read_input_tokens or 0)


def test_an_assistant_turn_echoed_by_model_dump_is_accepted(client: anthropic.Anthropic) -> None:
    """Frameworks send the answer back as `[b.model_dump() for b in message.content]`: every field
    the client's models hold (`caller`, `toolset_name`, `citations`, nulls included) comes back,
    and the same prompt renders as when the blocks are echoed as they came."""
    kwargs: Any = {**GREEDY, "max_tokens": 32, "tools": [WEATHER],
                   "tool_choice": {"type": "tool", "name": "get_weather"}}
    out = client.messages.create(messages=ASK_WEATHER, **kwargs)
    dumped = [b.model_dump() for b in out.content]
    assert set(dumped[0]) > {"type", "id", "name", "input"}, dumped  # the client's extra fields
    result = {"role": "user", "content": [{"type": "tool_result", "tool_use_id": out.content[0].id, "content": "18"}]}
    counts = [client.messages.count_tokens(model="m", tools=[WEATHER],
                                           messages=[*ASK_WEATHER, {"role": "assistant", "content": content}, result])
              for content in (dumped, out.content)]
    assert counts[0].input_tokens == counts[1].input_tokens > 0


def test_a_shared_prefix_is_read_from_the_cache(client: anthropic.Anthropic) -> None:
    system = "You are a careful assistant. " + " ".join(f"Rule {i}: be brief." for i in range(40))
    for question in ("Name a fruit.", "Name a tree."):
        out = client.messages.create(system=system, messages=[{"role": "user", "content": question}],
                                     model="m", max_tokens=1, extra_body={"temperature": 0})
    assert (out.usage.cache_read_input_tokens or 0) > 200, out.usage


BAD_BODIES = [
    ("missing max_tokens", {"model": "m", "messages": ASK}, "max_tokens"),
    ("max_tokens a string", {**RAW_GREEDY, "max_tokens": "10", "messages": ASK}, "max_tokens"),
    ("temperature a string", {**RAW_GREEDY, "temperature": "hot", "messages": ASK}, "temperature"),
    ("max_tokens past the context", {**RAW_GREEDY, "max_tokens": 10**6, "messages": ASK}, "max_tokens"),
    ("unknown block type", {**RAW_GREEDY, "messages": [{"role": "user", "content": [
        {"type": "video", "url": "x"}]}]}, "messages.0.content.0.type"),
    ("image block", {**RAW_GREEDY, "messages": [{"role": "user", "content": [
        {"type": "image", "source": {}}]}]}, "messages.0.content.0.type"),
    ("bad tool_choice", {**RAW_GREEDY, "messages": ASK, "tools": [WEATHER],
                         "tool_choice": {"type": "required"}}, "tool_choice.type"),
    ("tool_choice names no tool", {**RAW_GREEDY, "messages": ASK, "tools": [WEATHER],
                                   "tool_choice": {"type": "tool", "name": "nope"}}, "tool_choice.name"),
    ("assistant first", {**RAW_GREEDY, "messages": [{"role": "assistant", "content": "hi"}, *ASK]},
     "messages.0.role"),
    ("a tool_result without its tool_use", {**RAW_GREEDY, "messages": [{"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "toolu_1", "content": "x"}]}]},
     "messages.0.content.0.tool_use_id"),
    ("unknown field", {**RAW_GREEDY, "messages": ASK, "frequency_penalty": 1}, "frequency_penalty"),
]


@pytest.mark.parametrize("name, body, field", BAD_BODIES, ids=[b[0] for b in BAD_BODIES])
def test_bad_bodies_are_400s_in_anthropics_shape(server: RunningServer, name: str,
                                                 body: dict[str, Any], field: str) -> None:
    resp = post(server, "/v1/messages", body, headers={"anthropic-version": "2023-06-01"})
    assert resp.status_code == 400, resp.text
    out = resp.json()
    assert out["type"] == "error" and out["error"]["type"] == "invalid_request_error", out
    assert out["error"]["message"].startswith(field + ":") or \
        out["error"]["message"].startswith(field + " "), out


def test_the_client_raises_bad_request_with_the_body(client: anthropic.Anthropic,
                                                     server: RunningServer) -> None:
    with pytest.raises(anthropic.BadRequestError) as info:
        client.messages.create(model="m", max_tokens=0, messages=ASK)  # type: ignore[arg-type]
    assert info.value.status_code == 400 and "max_tokens" in info.value.message
    resp = requests.post(server.url + "/v1/messages", data=b"{", timeout=10,
                         headers={"Content-Type": "application/json"})
    assert resp.status_code == 400 and resp.json()["type"] == "error"
