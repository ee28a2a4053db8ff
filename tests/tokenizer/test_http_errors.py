"""Bad requests, sizes and the API key against the real server (the run's `key_server`,
tests/conftest.py: an API key and a 64 KiB body limit): every rejection is an OpenAI error object
naming the problem, none reaches the scheduler, and a good request still works afterwards; a
killed child fails everything (the last test: it ends that server).
The first tests run the app in-process with a fake manager: phases and internal errors."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import threading
from collections.abc import AsyncIterator
from typing import Any

import openai
import pytest
import requests
from aiohttp.test_utils import TestClient, TestServer

from runtime.contracts.config import ServerConfig
from runtime.contracts.errors import InvalidRequest as InvalidRequest_
from runtime.contracts.errors import RuntimeCrashed
from tests.tokenizer.http_helpers import (
    API_KEY,
    AUTH,
    KEY_SERVER_BODY_LIMIT,
    RunningServer,
    server_state,
    wait_until,
)
from tokenizer.http_server import create_app
from tokenizer.request_state import StateDelta
from tokenizer.server_state import Phase, ServerState

BODY_LIMIT = KEY_SERVER_BODY_LIMIT
CHAT = "/v1/chat/completions"
COMP = "/v1/completions"
GEN = "/generate"
MSG = [{"role": "user", "content": "hi"}]

# ---------------------------------------------------------------- in-process, fake manager


class FakeManager:
    """Just enough of a TokenizerManager: `submit` fails in the way the test asks."""

    dead_reason: str | None = None
    is_healthy = True
    on_output = None
    on_reject = None
    context_length = 100

    def __init__(self, failure: BaseException, after_one_chunk: bool) -> None:
        self.failure, self.after_one_chunk = failure, after_one_chunk

    async def submit(self, req: Any) -> AsyncIterator[tuple[int, StateDelta]]:
        if not self.after_one_chunk:
            raise self.failure

        async def results() -> AsyncIterator[tuple[int, StateDelta]]:
            yield 0, StateDelta("a", [1], None, None, None, 1, 1, 0, None, "rid", 0.0)
            raise self.failure

        return results()


def _app_request(manager: Any, method: str, path: str, body: Any = None,
                 **kwargs: Any) -> tuple[int, str, dict[str, str]]:
    """(status, text, headers) of one request to the app in-process (no manager: starting)."""
    async def call() -> tuple[int, str, dict[str, str]]:
        server = ServerState(ServerConfig(model_path="/models/fake", context_length=100))
        if manager is not None:
            server.attach(manager)  # type: ignore[arg-type]
        async with TestClient(TestServer(create_app(server))) as client:
            if body is not None:
                kwargs["json"] = body
            resp = await client.request(method, path, **kwargs)
            return resp.status, await resp.text(), dict(resp.headers)

    return asyncio.run(call())


def _app_call(manager: FakeManager | None, method: str, path: str,
              body: Any = None) -> tuple[int, str]:
    return _app_request(manager, method, path, body)[:2]


EVERY_ROUTE = [("GET", "/health"), ("GET", "/health_generate"), ("POST", GEN), ("POST", CHAT), ("POST", COMP),
               ("GET", "/get_server_info"), ("POST", "/flush_cache"), ("GET", "/v1/models"),
               ("GET", "/get_model_info"), ("POST", "/abort_request"), ("GET", "/metrics")]


def test_while_starting_every_route_says_retry_later() -> None:
    """Clients that poll /v1/models or /get_model_info for readiness start only when
    generations can run (they answered 200 while every generation got 503)."""
    for method, path in EVERY_ROUTE:
        status, text, headers = _app_request(None, method, path, {"text": "hi"} if method == "POST" else None)
        assert status == 503 and "starting" in text, (path, text)
        assert headers["Retry-After"] == "1", path
        assert json.loads(text)["error"]["type"] == "service_unavailable_error"


class SlowManager(FakeManager):
    async def get_server_info(self) -> dict[str, Any]:
        raise TimeoutError  # the scheduler did not answer its control message in time


def test_an_internal_timeout_is_504_not_500() -> None:
    status, text = _app_call(SlowManager(RuntimeError(), False), "GET", "/get_server_info")
    assert status == 504 and json.loads(text)["error"]["type"] == "timeout_error", text


@pytest.mark.parametrize("content_type", ["text/plain", "application/x-www-form-urlencoded", "multipart/form-data"])
def test_json_routes_refuse_bodies_that_are_not_json(content_type: str) -> None:
    """A web page can POST these cross-site without a preflight: refused before parsing."""
    manager = FakeManager(RuntimeError("must not run"), False)
    for path in (GEN, CHAT, COMP, "/abort_request"):
        status, text, _ = _app_request(manager, "POST", path, data=b'{"text": "hi"}',
                                       headers={"Content-Type": content_type})
        assert status == 415 and "application/json" in json.loads(text)["error"]["message"], (path, text)


def test_json_with_parameters_and_bodies_without_a_type_are_read() -> None:
    manager = FakeManager(InvalidRequest_("reached the manager"), False)
    for headers in ({"Content-Type": "application/json; charset=utf-8"}, {"Content-Type": "application/octet-stream"},
                    {"Content-Type": "application/vnd.api+json"}, {}):
        status, text, _ = _app_request(manager, "POST", GEN, data=b'{"text": "hi"}', headers=headers)
        assert status == 400 and "reached the manager" in text, (headers, text)


def test_unexpected_errors_are_500_without_details() -> None:
    status, text = _app_call(FakeManager(RuntimeError("secret detail"), False), "POST", GEN,
                             {"text": "hi"})
    assert status == 500 and "secret" not in text and json.loads(text)["error"]["code"] == 500
    status, text = _app_call(FakeManager(RuntimeCrashed("scheduler died"), False), "POST", GEN,
                             {"text": "hi"})
    assert status == 503 and "scheduler died" in text


def test_errors_after_the_stream_started_are_events() -> None:
    for failure, code in ((RuntimeError("secret detail"), 500), (RuntimeCrashed("gone"), 503)):
        status, text = _app_call(FakeManager(failure, True), "POST", GEN,
                                 {"text": "hi", "stream": True})
        events = [line[len("data: "):] for line in text.splitlines() if line.startswith("data: ")]
        assert status == 200 and events[-1] == "[DONE]" and json.loads(events[0])["text"] == "a"
        assert json.loads(events[-2])["error"]["code"] == code and "secret" not in text


# ---------------------------------------------------------------- the real server



@pytest.fixture(scope="module")
def server(key_server: RunningServer) -> RunningServer:
    return key_server


def _chat(**fields: Any) -> dict[str, Any]:
    return {"model": "m", "messages": MSG, "max_tokens": 4, **fields}


def _comp(**fields: Any) -> dict[str, Any]:
    return {"model": "m", "prompt": "hi", "max_tokens": 4, **fields}


RAW = object()  # marks a body sent as raw bytes


def _deep(template: str) -> bytes:
    """`template` with DEEP replaced by an object nested 1000 levels: it parses (orjson allows
    1024), but the server's json.dumps of it recursed into a 500."""
    return template.replace("DEEP", '{"a": ' * 1000 + "{}" + "}" * 1000).encode()
BAD_REQUESTS: list[tuple[str, str, Any, int, str, str | None]] = [
    # (path, method, body, status, words in the message, param)
    (CHAT, "POST", (RAW, b"not json{{{"), 400, "not valid JSON", None),
    (CHAT, "POST", (RAW, b""), 400, "empty", None),
    (CHAT, "POST", [1, 2], 400, "JSON object", None),
    (GEN, "POST", 42, 400, "JSON object", None),
    (COMP, "POST", None, 400, "JSON object", None),
    (COMP, "POST", _comp(prompt=""), 400, "prompt", "prompt"),
    (COMP, "POST", _comp(prompt=[]), 400, "prompt", "prompt"),
    (COMP, "POST", _comp(prompt=[999999]), 400, "outside", "prompt"),
    (COMP, "POST", _comp(prompt=[[1, 2], [-1]]), 400, "greater than or equal to 0", "prompt[1][0]"),
    (COMP, "POST", _comp(prompt="hello " * 2100), 400, "context length", "prompt"),
    (COMP, "POST", _comp(max_tokens=5000), 400, "maximum context length", "max_tokens"),
    (COMP, "POST", _comp(max_tokens=-1), 400, "max_tokens", "max_tokens"),
    (COMP, "POST", _comp(logprobs=50), 400, "logprobs", "logprobs"),
    (COMP, "POST", _comp(seed=-1), 400, "seed", "seed"),
    (COMP, "POST", _comp(regex="[a-z]+", json_schema="{}"), 400, "at most one", "regex"),
    (COMP, "POST", _comp(suffix="x"), 400, "suffix", "suffix"),
    (CHAT, "POST", _chat(messages=[]), 400, "messages", "messages"),
    (CHAT, "POST", _chat(messages=[{"role": "wizard", "content": "x"}]), 400, "role",
     "messages[0].role"),
    (CHAT, "POST", _chat(messages=[{"role": "user", "content": [{"type": "image_url"}]}]), 400,
     "must be one of 'text'", "messages[0].content[0].type"),
    (CHAT, "POST", _chat(temperature="hot"), 400, "temperature: input should be a valid number", "temperature"),
    (CHAT, "POST", _chat(top_p=1.5), 400, "top_p", "top_p"),
    (CHAT, "POST", _chat(frequency_penalty=3), 400, "frequency_penalty", "frequency_penalty"),
    (CHAT, "POST", _chat(n=99), 400, "n: must be <= 16", "n"),
    (CHAT, "POST", _chat(max_tokens="ten"), 400, "max_tokens: input should be a valid integer", "max_tokens"),
    (CHAT, "POST", _chat(logprobs=True, top_logprobs=50), 400, "top_logprobs", "top_logprobs"),
    (CHAT, "POST", _chat(top_logprobs=2), 400, "requires logprobs", "top_logprobs"),
    (CHAT, "POST", _chat(logit_bias={"999999": 1}), 400, "outside", "logit_bias"),
    (CHAT, "POST", _chat(stop_token_ids=[-5]), 400, "greater than or equal to 0", "stop_token_ids[0]"),
    (CHAT, "POST", _chat(stream="yes"), 400, "stream: input should be a valid boolean", "stream"),
    (CHAT, "POST", _chat(stream_options={"include_usage": True}), 400, "only allowed when stream",
     "stream_options"),
    (CHAT, "POST", _chat(response_format={"type": "json_schema", "json_schema": {"name": "x"}}),
     400, "schema", "response_format.json_schema.schema"),
    (CHAT, "POST", _chat(response_format={"type": "json_object"}, regex="a"), 400,
     "cannot be combined", "response_format"),
    (CHAT, "POST", _chat(tools=[{"type": "function", "function": {"name": "f"}}],
                         tool_choice={"type": "function", "function": {"name": "g"}}), 400,
     "not in tools", "tool_choice"),
    (CHAT, "POST", _chat(tools=[{"type": "function", "function": {"name": "f f"}}]), 400,
     "should match pattern", "tools[0].function.name"),
    (CHAT, "POST", _chat(tool_choice="sometimes"), 400, "tool_choice", "tool_choice"),
    (CHAT, "POST", _chat(foo=1), 400, "unknown field", "foo"),
    (GEN, "POST", {"text": "hi", "input_ids": [1]}, 400, "exactly one", "text"),
    (GEN, "POST", {"text": "hi", "sampling_params": {"max_new_tokens": -1}}, 400,
     "max_new_tokens", "sampling_params.max_new_tokens"),
    (GEN, "POST", {"text": "hi", "sampling_params": {"regex": "a", "ebnf": "root ::= 'a'"}}, 400,
     "at most one", "sampling_params.ebnf"),
    (GEN, "POST", {"text": "hi", "sampling_params": {"nope": 1}}, 400, "unknown", "sampling_params.nope"),
    ("/abort_request", "POST", {}, 400, "rid", "rid"),
    (GEN, "POST", {"text": "hi", "sampling_params": {"stop": ["x" * 513]}}, 400, "1 to 512 characters",
     "sampling_params.stop[0]"),
    (GEN, "POST", {"text": "hi", "sampling_params": {"stop_token_ids": [1] * 257}}, 400, "0 to 256 items",
     "sampling_params.stop_token_ids"),
    (CHAT, "POST", _chat(logit_bias={str(i): 1 for i in range(1025)}), 400, "0 to 1024 entries", "logit_bias"),
    (GEN, "POST", {"text": "hi", "rid": "r" * 257}, 400, "1 to 256 characters", "rid"),
    (COMP, "POST", _comp(timeout=0), 400, "timeout", "timeout"),
    # (written as text: neither the stdlib encoder of `requests` nor orjson writes 1000 levels)
    (GEN, "POST", (RAW, _deep('{"text": "hi", "sampling_params": {"json_schema": DEEP}}')), 400,
     "nested too deeply", "sampling_params.json_schema"),
    (CHAT, "POST", (RAW, _deep('{"model": "m", "messages": [{"role": "user", "content": "hi"}], '
                               '"response_format": {"type": "json_schema", '
                               '"json_schema": {"name": "x", "schema": DEEP}}}')),
     400, "nested too deeply", "response_format.json_schema.schema"),
    (CHAT, "POST", (RAW, _deep('{"model": "m", "messages": [{"role": "user", "content": "hi"}], '
                               '"tools": [{"type": "function", "function": {"name": "f", "parameters": DEEP}}]}')),
     400, "nested too deeply", "tools[0].function.parameters"),
    (CHAT, "GET", None, 405, "not allowed", None),
    ("/flush_cache", "GET", None, 405, "not allowed", None),
    ("/no/such/route", "GET", None, 404, "Not found", None),
]


@pytest.mark.slow
@pytest.mark.parametrize(("path", "method", "body", "status", "words", "param"), BAD_REQUESTS,
                         ids=[f"{i}-{r[0]}" for i, r in enumerate(BAD_REQUESTS)])
def test_bad_request(server: RunningServer, path: str, method: str, body: Any, status: int,
                     words: str, param: str | None) -> None:
    if isinstance(body, tuple) and body[0] is RAW:
        kwargs: dict[str, Any] = {"data": body[1]}
    else:
        kwargs = {"json": body} if method == "POST" else {}
    resp = requests.request(method, server.url + path, headers=AUTH, timeout=30, **kwargs)
    assert resp.status_code == status, resp.text
    error = resp.json()["error"]
    assert words in error["message"], error
    assert error["param"] == param and error["code"] == status and error["type"]


@pytest.mark.slow
def test_nothing_reached_the_scheduler_and_good_requests_work(server: RunningServer) -> None:
    state = server_state(server, AUTH)
    assert state["integrity"] == "ok" and state["running"] == 0
    client = openai.OpenAI(base_url=server.url + "/v1", api_key=API_KEY, max_retries=0)
    out = client.chat.completions.create(model="m", messages=MSG, max_tokens=3, temperature=0)
    assert out.choices[0].message.content
    with pytest.raises(openai.BadRequestError, match="top_p"):
        client.chat.completions.create(model="m", messages=MSG, max_tokens=3, top_p=7)


@pytest.mark.slow
def test_request_body_over_the_limit_is_413(server: RunningServer) -> None:
    big = {"text": "x" * (BODY_LIMIT + 10)}
    resp = requests.post(server.url + GEN, json=big, headers=AUTH, timeout=30)
    assert resp.status_code == 413 and resp.json()["error"]["code"] == 413
    chunked = iter([b'{"text": "', b"x" * (BODY_LIMIT + 10), b'"}'])  # no Content-Length
    resp = requests.post(server.url + GEN, data=chunked, headers=AUTH, timeout=30)
    assert resp.status_code == 413, resp.text


ROUTES = [
    ("POST", GEN, {"text": "hi", "sampling_params": {"max_new_tokens": 1}}),
    ("GET", "/health_generate", None), ("GET", "/get_model_info", None),
    ("GET", "/get_server_info", None), ("POST", "/flush_cache", None),
    ("POST", "/abort_request", {"rid": "nothing"}), ("GET", "/metrics", None),
    ("GET", "/v1/models", None), ("POST", COMP, _comp(max_tokens=1)),
    ("POST", CHAT, _chat(max_tokens=1)),
]


@pytest.mark.slow
@pytest.mark.parametrize(("method", "path", "body"), ROUTES, ids=[r[1] for r in ROUTES])
def test_api_key_guards_every_route(server: RunningServer, method: str, path: str,
                                    body: Any) -> None:
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": API_KEY}):
        resp = requests.request(method, server.url + path, json=body, headers=headers, timeout=30)
        assert resp.status_code == 401, (headers, resp.text)
        assert resp.json()["error"]["type"] == "authentication_error"
    resp = requests.request(method, server.url + path, json=body, headers=AUTH, timeout=30)
    assert resp.status_code == 200, resp.text


@pytest.mark.slow
def test_health_is_exempt_and_unknown_routes_are_not(server: RunningServer) -> None:
    assert requests.get(server.url + "/health", timeout=10).status_code == 200
    assert requests.get(server.url + "/secret", timeout=10).status_code == 401
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        client.models.list()


def _runtime_children(pid: int) -> list[int]:
    """The spawned scheduler/detokenizer processes of the server `pid` (any of its threads may
    have spawned them, so every task's children are read), in the order they were started."""
    children = []
    for task in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{task}/children") as fh:
            children += [int(c) for c in fh.read().split()]
    out = []
    for child in children:
        # Retitled "radixserve::<name>" where setproctitle is installed (the router extra brings it).
        if b"spawn_main" in _cmdline(child) or _cmdline(child).startswith(b"radixserve::"):
            out.append(child)

    def started(child: int) -> tuple[int, int]:  # (start time in clock ticks, pid)
        with open(f"/proc/{child}/stat") as fh:
            return int(fh.read().rsplit(")", 1)[1].split()[19]), child

    return sorted(out, key=started)


def _cmdline(pid: int) -> bytes:
    with open(f"/proc/{pid}/cmdline", "rb") as fh:
        return fh.read()


@pytest.mark.slow
@pytest.mark.ends_server
def test_a_dead_child_fails_requests_and_exits_nonzero(server: RunningServer) -> None:
    """Last in this module: it kills the server's runtime. The scheduler (tokenizer/launch.py
    starts it before the detokenizer) is killed once the stream has its first event and both
    requests run."""
    results: dict[str, Any] = {}
    streaming = threading.Event()

    def stream() -> None:
        body = {"text": "Count:", "stream": True, "sampling_params": {"max_new_tokens": 1500}}
        with requests.post(server.url + GEN, json=body, headers=AUTH, stream=True,
                           timeout=60) as resp:
            results["events"] = []
            for line in resp.iter_lines():
                if line:
                    results["events"].append(line)
                    streaming.set()

    def plain() -> None:
        body = {"text": "Count:", "sampling_params": {"max_new_tokens": 1500}}
        results["plain"] = requests.post(server.url + GEN, json=body, headers=AUTH, timeout=60)

    workers = [threading.Thread(target=stream), threading.Thread(target=plain)]
    for w in workers:
        w.start()
    assert streaming.wait(60), "no stream event in 60 s"
    wait_until(lambda: server_state(server, AUTH)["running"] == 2, "both requests to run", timeout=60)
    children = _runtime_children(server.process.pid)
    assert len(children) == 2
    scheduler = children[0]
    assert not _cmdline(scheduler).startswith(b"radixserve::") or _cmdline(scheduler).startswith(
        b"radixserve::scheduler"), _cmdline(scheduler)
    os.kill(scheduler, signal.SIGKILL)
    for w in workers:
        w.join(30)
    assert results["events"][-1] == b"data: [DONE]"
    assert b'"error"' in results["events"][-2] and b"503" in results["events"][-2]
    assert results["plain"].status_code == 503
    assert server.process.wait(30) == 1
    assert "exit code 1" in server.log()


def test_health_is_503_with_the_reason_after_a_crash() -> None:
    async def call() -> tuple[int, str, dict[str, str]]:
        server = ServerState(ServerConfig(model_path="/models/fake", context_length=100))
        server.attach(FakeManager(RuntimeError(), False))  # type: ignore[arg-type]
        server.phase, server.dead_reason = Phase.DEAD, "the scheduler process crashed: RuntimeError: boom"
        async with TestClient(TestServer(create_app(server))) as client:
            resp = await client.get("/health")
            return resp.status, await resp.text(), dict(resp.headers)

    status, text, headers = asyncio.run(call())
    assert status == 503 and "boom" in text and headers["Retry-After"] == "1"
