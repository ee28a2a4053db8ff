"""POST /v1/responses and the stored-response routes through the real server (the run's shared
default server), driven by the official `openai` client, unmodified. Greedy and short."""

from __future__ import annotations

import json
from typing import Any

import openai
import pytest
import requests

from tests.tokenizer.http_helpers import RunningServer, post

pytestmark = pytest.mark.slow

GREEDY: dict[str, Any] = {"model": "default", "temperature": 0}
WEATHER_TOOL = {"type": "function", "name": "get_weather", "description": "The weather in a city.",
                "parameters": {"type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "Rome"]}},
                               "required": ["city"], "additionalProperties": False}, "strict": True}
YES_NO = {"format": {"type": "json_schema", "name": "answer", "strict": True,
                     "schema": {"type": "object", "properties": {"answer": {"type": "string", "enum": ["yes", "no"]}},
                                "required": ["answer"], "additionalProperties": False}}}


def _client(server: RunningServer, key: str = "key-a") -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key=key, max_retries=0, timeout=60)


def test_create_returns_a_message_usage_and_status(shared_server: RunningServer) -> None:
    client = _client(shared_server)
    resp = client.responses.create(input="Name a color.", instructions="Answer briefly.", max_output_tokens=8,
                                   metadata={"run": "1"}, user="u1", **GREEDY)
    assert resp.id.startswith("resp_") and resp.object == "response" and resp.metadata == {"run": "1"}
    message = resp.output[0]
    assert message.type == "message" and message.id.startswith("msg_") and message.role == "assistant"
    assert resp.output_text and message.content[0].type == "output_text"
    assert resp.usage is not None and resp.usage.output_tokens <= 8 and resp.usage.input_tokens > 0
    assert resp.status in ("completed", "incomplete")
    if resp.status == "incomplete":
        assert resp.incomplete_details is not None and resp.incomplete_details.reason == "max_output_tokens"


def test_stream_sends_the_documented_events_and_joins_to_the_greedy_text(shared_server: RunningServer) -> None:
    client = _client(shared_server)
    args = {"input": "Is the sky blue?", "text": YES_NO, "max_output_tokens": 24, **GREEDY}
    whole = client.responses.create(**args)
    with client.responses.stream(**args) as stream:
        events = list(stream)
        final = stream.get_final_response()
    kinds = [e.type for e in events]
    assert kinds[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"]
    assert kinds[-4:] == ["response.output_text.done", "response.content_part.done", "response.output_item.done",
                          "response.completed"]
    assert set(kinds[4:-4]) == {"response.output_text.delta"}
    assert [e.sequence_number for e in events] == list(range(len(events)))
    joined = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert joined == final.output_text == whole.output_text and json.loads(joined)["answer"] in ("yes", "no")
    assert whole.status == final.status == "completed"


def test_previous_response_id_continues_from_the_radix_cache(shared_server: RunningServer) -> None:
    client = _client(shared_server)
    first = client.responses.create(input="Tell me about the city of Lyon in France.", max_output_tokens=12,
                                    **GREEDY)
    second = client.responses.create(previous_response_id=first.id, input="And its river?", max_output_tokens=4,
                                     **GREEDY)
    assert first.usage is not None and second.usage is not None
    # the second prompt is the first one, its answer and the new message: the whole first turn
    # is cached but the answer's last token (sampled, never run through the model)
    assert second.usage.input_tokens > first.usage.input_tokens + first.usage.output_tokens
    cached = second.usage.input_tokens_details.cached_tokens
    assert cached >= first.usage.input_tokens + first.usage.output_tokens - 1
    assert second.previous_response_id == first.id


def test_function_call_round_trip(shared_server: RunningServer) -> None:
    client = _client(shared_server)
    stream = client.responses.create(input="What is the weather in Paris?", tools=[WEATHER_TOOL],  # type: ignore[list-item]
                                     tool_choice={"type": "function", "name": "get_weather"}, stream=True,
                                     max_output_tokens=32, **GREEDY)
    events = list(stream)
    kinds = [e.type for e in events]
    assert kinds[-1] == "response.completed"
    assert kinds.index("response.output_item.added") < kinds.index("response.function_call_arguments.delta") \
        < kinds.index("response.function_call_arguments.done") < kinds.index("response.output_item.done")
    first = events[-1].response  # type: ignore[union-attr]
    call = first.output[-1]
    assert call.type == "function_call" and call.name == "get_weather"
    assert call.id.startswith("fc_") and call.call_id.startswith("call_")
    assert json.loads(call.arguments)["city"] in ("Paris", "Rome")
    deltas = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
    assert deltas == call.arguments
    result = {"type": "function_call_output", "call_id": call.call_id, "output": "Sunny, 21 C."}
    second = client.responses.create(previous_response_id=first.id, input=[result],  # type: ignore[list-item]
                                     tools=[WEATHER_TOOL], max_output_tokens=8, **GREEDY)  # type: ignore[list-item]
    assert second.output[0].type in ("message", "function_call") and second.usage is not None
    assert second.usage.input_tokens_details.cached_tokens >= first.usage.input_tokens  # type: ignore[union-attr]


def test_get_delete_and_ownership(shared_server: RunningServer) -> None:
    owner, other = _client(shared_server, "key-a"), _client(shared_server, "key-b")
    made = owner.responses.create(input="Hi", max_output_tokens=2, **GREEDY)
    assert owner.responses.retrieve(made.id).output_text == made.output_text
    with pytest.raises(openai.NotFoundError):
        other.responses.retrieve(made.id)
    with pytest.raises(openai.NotFoundError) as error:
        other.responses.create(previous_response_id=made.id, input="again", max_output_tokens=2, **GREEDY)
    assert error.value.body["param"] == "previous_response_id"  # type: ignore[index]
    with pytest.raises(openai.NotFoundError):
        other.responses.delete(made.id)
    owner.responses.delete(made.id)
    with pytest.raises(openai.NotFoundError):
        owner.responses.retrieve(made.id)
    unstored = owner.responses.create(input="Hi", max_output_tokens=2, store=False, **GREEDY)
    with pytest.raises(openai.NotFoundError):
        owner.responses.retrieve(unstored.id)
    salted = owner.responses.create(input="Hi", max_output_tokens=2, extra_body={"cache_salt": "tenant-1"}, **GREEDY)
    with pytest.raises(openai.NotFoundError):  # the same key, another tenant
        owner.responses.retrieve(salted.id)
    assert owner.responses.retrieve(salted.id, extra_query={"cache_salt": "tenant-1"}).id == salted.id


def test_cancel_stops_a_running_response(shared_server: RunningServer) -> None:
    client = _client(shared_server)
    stream = client.responses.create(input="Write a long story.", max_output_tokens=1000, stream=True, **GREEDY)
    events = iter(stream)
    created = next(events)
    assert created.type == "response.created"
    rid = created.response.id  # type: ignore[union-attr]
    with pytest.raises(openai.NotFoundError):
        _client(shared_server, "key-b").responses.cancel(rid)
    assert client.responses.cancel(rid).status == "cancelled"
    last = list(events)[-1]
    assert last.type == "response.failed" and last.response.status == "cancelled"  # type: ignore[union-attr]
    assert last.response.usage.output_tokens < 1000  # type: ignore[union-attr]


BAD = [
    ({"input": 5}, "input"),
    ({"input": [{"type": "message", "role": "bot", "content": "x"}]}, "input[0].role"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]}, "input[0].content[0].type"),
    ({"input": [{"type": "function_call", "call_id": "c", "name": "f", "arguments": 5}]}, "input[0].arguments"),
    ({"input": "hi", "tools": [{"type": "function", "name": "bad name"}]}, "tools[0].name"),
    ({"input": "hi", "tools": [{"type": "web_search"}]}, "tools[0].type"),
    ({"input": "hi", "tool_choice": {"type": "function", "name": "nope"}, "tools": [WEATHER_TOOL]}, "tool_choice"),
    ({"input": "hi", "text": {"format": {"type": "xml"}}}, "text.format.type"),
    ({"input": "hi", "text": {"format": {"type": "json_schema", "name": "a", "schema": 3}}}, "text.format.schema"),
    ({"input": "hi", "max_output_tokens": -1}, "max_output_tokens"),
    ({"input": "hi", "temperature": -1}, "temperature"),
    ({"input": "hi", "reasoning": {"effort": "high"}}, "reasoning.effort"),
    ({"input": "hi", "metadata": {"k": 1}}, "metadata.k"),
    ({"input": "hi", "frobnicate": 1}, "frobnicate"),
    ({"input": []}, "input"),
]


@pytest.mark.parametrize(("body", "param"), BAD, ids=[p for _, p in BAD])
def test_bad_inputs_are_400s_naming_the_field(shared_server: RunningServer, body: dict[str, Any],
                                              param: str) -> None:
    reply = post(shared_server, "/v1/responses", {"model": "m", **body})
    assert reply.status_code == 400, reply.text
    assert reply.json()["error"]["param"] == param, reply.text


def test_unknown_previous_response_is_a_404(shared_server: RunningServer) -> None:
    reply = post(shared_server, "/v1/responses", {"model": "m", "input": "hi", "previous_response_id": "resp_x"})
    assert reply.status_code == 404 and reply.json()["error"]["param"] == "previous_response_id"
    assert requests.get(shared_server.url + "/v1/responses/resp_x", timeout=10).status_code == 404
