"""Browser safety (tokenizer/browser_guard.py) and where the API key comes from (tokenizer/api_key.py).

Most tests run the app in-process with a fake manager that records what reached it; the last
one uses the real server with the default model and --api-key-file (the run's `key_server`,
tests/conftest.py)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import requests
from aiohttp.test_utils import TestClient, TestServer

from runtime.contracts.config import LOOPBACK_ORIGINS, ServerConfig, config_from_args
from runtime.contracts.errors import InvalidRequest
from tests.tokenizer.http_helpers import API_KEY, AUTH, RunningServer
from tokenizer import http_server
from tokenizer.api_key import resolve_api_key
from tokenizer.browser_guard import is_loopback_host_header, is_loopback_name, parse_origin
from tokenizer.cli import build_parser
from tokenizer.http_server import create_app
from tokenizer.request_state import StateDelta
from tokenizer.server_state import ServerState

EVIL = "https://evil.example"
LOCAL = "http://localhost:5173"
GEN_BODY = {"text": "hi", "sampling_params": {"max_new_tokens": 1}}
CHAT_BODY = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
# Every kind of route: generation, control, info, OpenAI, and /health (not exempt).
GUARDED = [("POST", "/generate", GEN_BODY), ("POST", "/abort_request", {"abort_all": True}),
           ("POST", "/flush_cache", None), ("POST", "/v1/chat/completions", CHAT_BODY),
           ("POST", "/v1/completions", {"model": "m", "prompt": "hi", "max_tokens": 1}),
           ("GET", "/v1/models", None), ("GET", "/get_server_info", None), ("GET", "/health", None),
           ("POST", "/tokenize", {"text": "hi"})]
NO_CORS_IMAGE = {"Sec-Fetch-Site": "cross-site", "Sec-Fetch-Mode": "no-cors", "Sec-Fetch-Dest": "image"}


class RecordingManager:
    """Just enough of a TokenizerManager; `calls` lists every method that was reached."""

    dead_reason: str | None = None
    is_healthy = True
    on_output = None
    on_reject = None
    context_length = 100

    def __init__(self, config: ServerConfig) -> None:
        self.config = config
        self.calls: list[str] = []
        self.rid_to_state: dict[str, Any] = {}

    async def submit(self, req: Any) -> AsyncIterator[tuple[int, StateDelta]]:
        self.calls.append("generate")

        async def results() -> AsyncIterator[tuple[int, StateDelta]]:
            yield 0, StateDelta("ok", [1], None, None, None, 1, 1, 0, {"type": "length"}, "rid", 0.0)

        return results()

    async def abort_all(self, owner: str | None = None) -> None:
        self.calls.append("abort_all")

    async def flush_cache(self) -> bool:
        self.calls.append("flush_cache")
        return True

    async def get_server_info(self) -> dict[str, Any]:
        self.calls.append("get_server_info")
        return {**self.config.public_dict(), "internal_states": [], "tokenizer_state": {}}


class Reply:
    def __init__(self, status: int, text: str, headers: dict[str, str]) -> None:
        self.status, self.text, self.headers = status, text, headers

    def error(self) -> dict[str, Any]:
        return dict(json.loads(self.text)["error"])


def _requests(config: ServerConfig, calls: list[tuple[str, str, dict[str, Any]]],
              ) -> tuple[list[Reply], list[str]]:
    """Send `calls` (method, path, aiohttp request kwargs) to the app; (replies, manager calls)."""
    async def run() -> tuple[list[Reply], list[str]]:
        server = ServerState(config)
        manager = RecordingManager(config)
        server.attach(manager)  # type: ignore[arg-type]
        replies = []
        async with TestClient(TestServer(create_app(server))) as client:
            for method, path, kwargs in calls:
                resp = await client.request(method, path, **kwargs)
                replies.append(Reply(resp.status, await resp.text(), dict(resp.headers)))
        return replies, manager.calls

    return asyncio.run(run())


def _one(method: str, path: str, config: ServerConfig | None = None, **kwargs: Any) -> Reply:
    return _requests(config or ServerConfig(), [(method, path, kwargs)])[0][0]


def _route_calls(headers: dict[str, str]) -> list[tuple[str, str, dict[str, Any]]]:
    return [(m, p, {"json": body, "headers": headers} if body else {"headers": headers}) for m, p, body in GUARDED]


# ---------------------------------------------------------------- Origin


def test_a_foreign_origin_is_refused_on_every_route_before_anything_runs() -> None:
    replies, reached = _requests(ServerConfig(), _route_calls({"Origin": EVIL}))
    for (_, path, _), reply in zip(GUARDED, replies):
        assert reply.status == 403, (path, reply.text)
        error = reply.error()
        assert error["type"] == "permission_error" and EVIL in error["message"], path
        assert "Access-Control-Allow-Origin" not in reply.headers, path
    assert reached == []


def test_origin_null_is_refused_by_default() -> None:
    reply = _one("POST", "/generate", json=GEN_BODY, headers={"Origin": "null"})
    assert reply.status == 403 and "sandboxed" in reply.error()["message"]


def test_loopback_origins_get_answers_with_cors_headers() -> None:
    origins = [LOCAL, "http://127.0.0.1:8080", "http://[::1]:3000", "https://localhost", "http://localhost"]
    calls = [("POST", "/generate", {"json": GEN_BODY, "headers": {"Origin": o}}) for o in origins]
    calls.append(("POST", "/generate", {"json": {**GEN_BODY, "stream": True}, "headers": {"Origin": LOCAL}}))
    replies, reached = _requests(ServerConfig(), calls)
    for origin, reply in zip([*origins, LOCAL], replies):
        assert reply.status == 200 and "ok" in reply.text, (origin, reply.text)
        assert reply.headers["Access-Control-Allow-Origin"] == origin
        assert "Origin" in reply.headers["Vary"]
    assert reached == ["generate"] * len(calls)
    assert "[DONE]" in replies[-1].text  # the stream's headers were sent inside its handler


def test_answers_without_origin_vary_on_it_and_allow_no_page() -> None:
    reply = _one("GET", "/health")
    assert reply.status == 200 and reply.headers["Vary"] == "Origin"
    assert "Access-Control-Allow-Origin" not in reply.headers


def test_preflight_is_204_for_allowed_origins_and_403_for_others() -> None:
    preflight = {"Access-Control-Request-Method": "POST",
                 "Access-Control-Request-Headers": "content-type, authorization"}
    config = ServerConfig(api_key="k")  # a preflight carries no key and must still pass
    calls = [("OPTIONS", "/v1/chat/completions", {"headers": {**preflight, "Origin": o}}) for o in (LOCAL, EVIL)]
    (allowed, refused), reached = _requests(config, calls)
    assert allowed.status == 204, allowed.text
    assert allowed.headers["Access-Control-Allow-Origin"] == LOCAL
    methods = {"GET", "POST", "PUT", "DELETE", "OPTIONS"}  # DELETE: /v1/responses/{id}
    assert set(allowed.headers["Access-Control-Allow-Methods"].split(", ")) == methods
    assert "Authorization" in allowed.headers["Access-Control-Allow-Headers"]
    assert "x-api-key" in allowed.headers["Access-Control-Allow-Headers"]  # Anthropic's clients
    assert "Content-Type" in allowed.headers["Access-Control-Allow-Headers"]
    assert refused.status == 403 and EVIL in refused.error()["message"]
    assert reached == []


def test_star_allows_every_page_null_included() -> None:
    config = ServerConfig(allowed_origins=("*",))
    calls = [("POST", "/generate", {"json": GEN_BODY, "headers": {"Origin": o}}) for o in (EVIL, "null")]
    calls.append(("OPTIONS", "/generate", {"headers": {"Origin": EVIL, "Access-Control-Request-Method": "POST"}}))
    calls.append(("GET", "/health", {"headers": NO_CORS_IMAGE}))
    replies, reached = _requests(config, calls)
    assert [r.status for r in replies] == [200, 200, 204, 200]
    assert replies[0].headers["Access-Control-Allow-Origin"] == EVIL
    assert reached == ["generate", "generate"]


def test_listed_origins_replace_the_defaults() -> None:
    config = ServerConfig(allowed_origins=("https://app.example.com", "http://localhost:8080"))
    calls = [("GET", "/health", {"headers": {"Origin": o}}) for o in
             ("https://app.example.com", "https://app.example.com:443", "https://app.example.com:8443",
              "http://localhost:8080", "http://localhost:8081", "http://127.0.0.1:8080")]
    replies, _ = _requests(config, calls)
    assert [r.status for r in replies] == [200, 200, 403, 200, 403, 403]


def test_origin_is_checked_before_the_api_key_and_the_body() -> None:
    config = ServerConfig(api_key="k")
    calls = [("POST", "/generate", {"data": b"not json{", "headers": {"Origin": EVIL}}),
             ("POST", "/generate", {"data": b"not json{", "headers": {"Origin": LOCAL}})]
    (foreign, local), _ = _requests(config, calls)
    assert foreign.status == 403
    assert local.status == 401 and local.headers["Access-Control-Allow-Origin"] == LOCAL  # the page reads why


# ---------------------------------------------------------------- untyped bodies and Sec-Fetch


def test_an_untyped_body_without_origin_still_works_and_with_a_foreign_one_does_not() -> None:
    raw = json.dumps(GEN_BODY).encode()
    # A browser's no-cors Blob POST: no Content-Type, but always an Origin.
    calls = [("POST", "/generate", {"data": raw, "headers": {}}),
             ("POST", "/generate", {"data": raw, "headers": {"Origin": EVIL, "Sec-Fetch-Mode": "no-cors",
                                                              "Sec-Fetch-Site": "cross-site"}})]
    (plain, browser), reached = _requests(ServerConfig(), calls)
    assert plain.status == 200 and "ok" in plain.text
    assert browser.status == 403 and reached == ["generate"]


def test_cross_site_requests_without_origin_are_refused_unless_navigations() -> None:
    navigation = {"Sec-Fetch-Site": "cross-site", "Sec-Fetch-Mode": "navigate", "Sec-Fetch-Dest": "document"}
    frame = {**navigation, "Sec-Fetch-Dest": "iframe"}
    typed = {"Sec-Fetch-Site": "none", "Sec-Fetch-Mode": "navigate", "Sec-Fetch-Dest": "document"}
    calls = [("GET", "/health_generate", {"headers": h}) for h in (NO_CORS_IMAGE, frame)]
    calls += [("GET", "/v1/models", {"headers": h}) for h in (navigation, typed)]
    replies, _ = _requests(ServerConfig(), calls)
    assert [r.status for r in replies] == [403, 403, 200, 200]
    assert "without Origin" in replies[0].error()["message"]


# ---------------------------------------------------------------- Host (DNS rebinding)


@pytest.mark.parametrize("host", ["localhost:30000", "LOCALHOST", "app.localhost:30000", "127.0.0.1:30000",
                                  "127.1.2.3", "[::1]:30000", "[::1]", "localhost."])
def test_loopback_host_headers(host: str) -> None:
    assert is_loopback_host_header(host)


@pytest.mark.parametrize("host", ["evil.example:30000", "evil.example", "localhost.evil.example", "10.0.0.1:30000",
                                  "0.0.0.0:30000", "[::2]:30000", "[::1", "localhost:x", "localhost:*", ""])
def test_other_host_headers(host: str) -> None:
    assert not is_loopback_host_header(host)


def test_a_foreign_host_is_refused_only_while_bound_to_loopback() -> None:
    evil = {"headers": {"Host": "evil.example:30000"}}
    for bind in ("127.0.0.1", "localhost", "::1", "127.0.0.2"):
        assert is_loopback_name(bind)
        reply = _one("GET", "/get_server_info", ServerConfig(host=bind), **evil)
        assert reply.status == 403 and "evil.example:30000" in reply.error()["message"], bind
    for bind in ("0.0.0.0", "::", "192.168.1.10"):
        assert not is_loopback_name(bind)
        assert _one("GET", "/get_server_info", ServerConfig(host=bind), **evil).status == 200, bind
    assert _one("GET", "/health", headers={"Host": "localhost:30000"}).status == 200


# ---------------------------------------------------------------- configuration


def test_origin_entries_parse_and_bad_ones_refuse_the_config() -> None:
    assert parse_origin("HTTP://LocalHost:80") == parse_origin("http://localhost")
    assert parse_origin("http://localhost:*") is None  # a wildcard is for --allowed-origins only
    assert parse_origin("http://localhost:*", pattern=True) is not None
    assert all(parse_origin(o, pattern=True) for o in LOOPBACK_ORIGINS)
    for bad in (("null",), ("http://localhost/",), ("localhost:3000",), ("http://a.b/path",), "http://a.b"):
        with pytest.raises(InvalidRequest, match="allowed_origins"):
            ServerConfig(allowed_origins=bad)  # type: ignore[arg-type]


def _parse(*argv: str) -> ServerConfig:
    return config_from_args(build_parser().parse_args(["serve", *argv]))


def test_allowed_origins_flag() -> None:
    assert _parse().allowed_origins == LOOPBACK_ORIGINS
    assert _parse("--allowed-origins", "*").allowed_origins == ("*",)
    assert _parse("--allowed-origins", "https://a.example", "http://localhost:*").allowed_origins == (
        "https://a.example", "http://localhost:*")
    assert _parse("--allowed-origins").allowed_origins == ()  # no page at all


# ---------------------------------------------------------------- the API key


def test_api_key_sources_and_their_precedence(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    key_file = tmp_path / "key"
    key_file.write_text("  from-file\n")
    monkeypatch.delenv("RADIXSERVE_API_KEY", raising=False)
    assert resolve_api_key(ServerConfig()).api_key is None
    monkeypatch.setenv("RADIXSERVE_API_KEY", " from-env ")
    assert resolve_api_key(ServerConfig()).api_key == "from-env"
    assert resolve_api_key(ServerConfig(api_key_file=str(key_file))).api_key == "from-file"
    assert resolve_api_key(ServerConfig(api_key="flag", api_key_file=str(key_file))).api_key == "flag"


def test_a_key_from_the_environment_guards_the_app_and_stays_secret(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RADIXSERVE_API_KEY", "env-secret-123")
    config = resolve_api_key(ServerConfig())
    assert "env-secret-123" not in json.dumps(config.public_dict())
    calls = [("GET", "/get_server_info", {}),
             ("GET", "/get_server_info", {"headers": {"Authorization": "Bearer env-secret-123"}})]
    (denied, info), _ = _requests(config, calls)
    assert denied.status == 401
    assert info.status == 200 and "env-secret-123" not in info.text and "api_key_file" in info.text


def test_a_key_file_guards_the_app(tmp_path: Path) -> None:
    key_file = tmp_path / "key"
    key_file.write_text("file-secret\n")
    config = resolve_api_key(ServerConfig(api_key_file=str(key_file)))
    calls = [("POST", "/flush_cache", {}),
             ("POST", "/flush_cache", {"headers": {"Authorization": "Bearer file-secret"}})]
    (denied, flushed), reached = _requests(config, calls)
    assert (denied.status, flushed.status, reached) == (401, 200, ["flush_cache"])


def test_an_unreadable_or_empty_key_refuses_the_start(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    empty = tmp_path / "empty"
    empty.write_text(" \n")
    for path, words in ((tmp_path / "missing", "cannot read"), (empty, "is empty"), (tmp_path, "cannot read")):
        with pytest.raises(InvalidRequest, match=words):
            resolve_api_key(ServerConfig(api_key_file=str(path)))
    # serve() stops before launching anything, with exit code 2 and the reason.
    assert http_server.serve(ServerConfig(api_key_file=str(tmp_path / "missing"))) == 2
    assert "API key file" in capsys.readouterr().err
    monkeypatch.setenv("RADIXSERVE_API_KEY", "  ")
    with pytest.raises(InvalidRequest, match="blank"):
        resolve_api_key(ServerConfig())


# ---------------------------------------------------------------- the real server


@pytest.mark.slow
def test_real_server_refuses_a_foreign_page_and_serves_plain_clients(key_server: RunningServer) -> None:
    server = key_server
    body = json.dumps({"text": "The capital of France is",
                       "sampling_params": {"max_new_tokens": 4, "temperature": 0}}).encode()
    foreign = requests.post(server.url + "/generate", data=body, timeout=60,
                            headers={**AUTH, "Origin": EVIL, "Sec-Fetch-Mode": "no-cors"})
    assert foreign.status_code == 403 and EVIL in foreign.json()["error"]["message"]
    abort = requests.post(server.url + "/abort_request", json={"abort_all": True},
                          headers={"Origin": EVIL}, timeout=30)
    assert abort.status_code == 403
    plain = requests.post(server.url + "/generate", data=body, headers=AUTH, timeout=60)  # no Content-Type
    assert plain.status_code == 200 and plain.json()["meta_info"]["completion_tokens"] >= 1, plain.text
    assert requests.post(server.url + "/generate", data=body, timeout=60).status_code == 401  # the key is required
    info = requests.get(server.url + "/get_server_info", headers=AUTH, timeout=30)
    assert info.status_code == 200 and API_KEY not in info.text
    assert requests.get(server.url + "/health", timeout=10).status_code == 200
    assert API_KEY not in Path(f"/proc/{server.process.pid}/cmdline").read_text()
