"""Hostile /v1/chat/completions bodies against the real server (one subprocess, the default
model), sent as raw bytes so that JSON escapes reach the server as a client writes them: a
request's own chat template, reserved `chat_template_kwargs`, tool-call arguments nested 50k deep
or holding a lone surrogate, huge numbers, wrong types at depth. Each is a 400 naming its field;
the server then still answers a normal chat exactly as before."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
import requests

from tests.tokenizer.http_helpers import RunningServer, server_state

pytestmark = pytest.mark.slow

CHAT = "/v1/chat/completions"
MSG = [{"role": "user", "content": "Name three colors."}]
GREEDY = {"model": "m", "messages": MSG, "max_tokens": 8, "temperature": 0}
ARGS = "messages[1].tool_calls[0].function.arguments"


@pytest.fixture
def server(shared_server: RunningServer) -> RunningServer:
    return shared_server  # the run's one default server (tests/conftest.py)


def _post(server: RunningServer, body: bytes) -> requests.Response:
    return requests.post(server.url + CHAT, data=body, timeout=60,
                         headers={"Content-Type": "application/json"})


def _history(arguments_json_text: str) -> bytes:
    """A body whose assistant message made a call with `arguments_json_text` as the raw JSON
    text of its `arguments` string (escapes included)."""
    return (b'{"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}, '
            b'{"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function", '
            b'"function": {"name": "f", "arguments": ' + arguments_json_text.encode() + b'}}]}, '
            b'{"role": "tool", "tool_call_id": "c1", "content": "ok"}]}')


def _chat(**fields: Any) -> bytes:
    return orjson.dumps({"model": "m", "messages": MSG, "max_tokens": 4, **fields})


def _deep(template: str, levels: int = 1000) -> bytes:
    """`template` with DEEP replaced by a list nested `levels` deep (orjson reads up to 1024)."""
    return template.replace("DEEP", "[" * levels + "]" * levels).encode()


HOSTILE: list[tuple[str, bytes, str | None, str]] = [
    # (case, raw body, param of the 400, words in its message)
    ("arguments 50k deep", _history('"' + "[" * 50_000 + "]" * 50_000 + '"'), ARGS, "nested too deeply"),
    ("arguments lone surrogate", _history(r'"{\"x\": \"\\ud800\"}"'), ARGS, "lone surrogate"),
    ("arguments 1e400", _history(r'"{\"x\": 1e400}"'), ARGS, "not finite"),
    ("arguments 10**5000", _history('"{\\"x\\": 1' + "0" * 5000 + '}"'), ARGS, "out of range"),
    ("arguments NaN", _history(r'"{\"x\": NaN}"'), ARGS, "NaN"),
    ("body lone surrogate", b'{"model": "m", "messages": [{"role": "user", "content": "\\ud800"}]}',
     None, "not valid JSON"),
    ("body 1e400", b'{"model": "m", "messages": [{"role": "user", "content": "hi"}], "temperature": 1e400}',
     None, "not valid JSON"),
    ("body 10**5000", b'{"model": "m", "messages": [{"role": "user", "content": "hi"}], "seed": 1'
     + b"0" * 5000 + b"}", None, "not valid JSON"),
    ("role a deep list", _deep('{"model": "m", "messages": [{"role": DEEP, "content": "hi"}]}'),
     "messages[0].role", "role"),
    ("role a list", _chat(messages=[{"role": ["user"], "content": "hi"}]), "messages[0].role", "role"),
    ("call id a deep list", _history('"{}"').replace(b'"c1", "type"', _deep('DEEP, "type"')),
     "messages[1].tool_calls[0].id", "valid string"),
    ("tool_call_id a number", _chat(messages=[{"role": "tool", "tool_call_id": 5, "content": "x"}]),
     "messages[0].tool_call_id", "valid string"),
    ("timeout a deep list", _deep('{"model": "m", "messages": [{"role": "user", "content": "hi"}], '
                                  '"timeout": DEEP}'), "timeout", "valid number"),
    ("tool_choice a deep list", _deep('{"model": "m", "messages": [{"role": "user", "content": "hi"}], '
                                      '"tool_choice": DEEP}'), "tool_choice", "tool_choice"),
    ("return_hidden_states deep", _deep('{"model": "m", "messages": [{"role": "user", "content": "hi"}], '
                                        '"return_hidden_states": DEEP}'), "return_hidden_states", "should be False"),
    ("tool parameters 100 deep", _chat(tools=[{"type": "function", "function": {
        "name": "f", "parameters": {"type": "object", "properties": orjson.loads(_deep("DEEP", 100))}}}]),
     "tools[0].function.parameters", "nested too deeply"),
    ("kwargs tokenize", _chat(chat_template_kwargs={"tokenize": True}), "chat_template_kwargs.tokenize",
     "not a template variable"),
    ("kwargs a bad key", _chat(chat_template_kwargs={"a-b": 1}), "chat_template_kwargs.a-b", "pattern"),
    ("kwargs a deep value", _chat(chat_template_kwargs={"x": orjson.loads(_deep("DEEP", 20))}),
     "chat_template_kwargs.x", "nested too deeply"),
]


@pytest.mark.parametrize(("case", "body", "param", "words"), HOSTILE, ids=[h[0] for h in HOSTILE])
def test_hostile_bodies_are_400s_naming_the_field(server: RunningServer, case: str, body: bytes,
                                                  param: str | None, words: str) -> None:
    resp = _post(server, body)
    assert resp.status_code == 400, resp.text
    error = resp.json()["error"]
    assert error["param"] == param and words in error["message"], error


def test_a_request_template_is_refused_and_chats_answer_as_before(
        server: RunningServer, default_model_path: str) -> None:
    before = _post(server, orjson.dumps(GREEDY)).json()
    injected = "Z{{ messages[0].content }}{% for i in range(99999) %}{{ i }}{% endfor %}"
    for body, param in ((_chat(chat_template_kwargs={"chat_template": injected}),
                         "chat_template_kwargs.chat_template"),
                        (_chat(chat_template=injected), "chat_template")):
        resp = _post(server, body)
        assert resp.status_code == 400 and resp.json()["error"]["param"] == param, resp.text
        assert "--trust-request-chat-template" in resp.json()["error"]["message"]
    after = _post(server, orjson.dumps(GREEDY)).json()
    assert after["choices"][0]["message"] == before["choices"][0]["message"]
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(default_model_path)
    prompt = tok.apply_chat_template(MSG, tokenize=False, add_generation_prompt=True)
    expected = len(tok.encode(prompt, add_special_tokens=False))
    assert before["usage"]["prompt_tokens"] == after["usage"]["prompt_tokens"] == expected


def test_template_variables_and_a_plain_history_are_accepted(server: RunningServer) -> None:
    plain = _post(server, orjson.dumps(GREEDY)).json()
    flagged = _post(server, orjson.dumps({**GREEDY, "chat_template_kwargs": {
        "enable_thinking": False, "reasoning_effort": "low"}}))
    assert flagged.status_code == 200, flagged.text
    assert flagged.json()["choices"][0]["message"] == plain["choices"][0]["message"]
    history = _post(server, _history(r'"{\"city\": \"Paris\", \"emoji\": \"\\ud83d\\ude00\"}"'))
    assert history.status_code == 200, history.text


def test_the_server_is_sound_afterwards(server: RunningServer) -> None:
    assert requests.get(server.url + "/health", timeout=10).status_code == 200
    state = server_state(server)
    assert state["integrity"] == "ok" and state["running"] == 0 and state["waiting"] == 0
    resp = _post(server, orjson.dumps(GREEDY))
    assert resp.status_code == 200 and resp.json()["choices"][0]["message"]["content"]
