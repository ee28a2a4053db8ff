"""Soak: mixed traffic against the real server for a while, then prove nothing was lost.

    make test                                        # SOAK_SECONDS (8 s) as part of the suite
    RADIXSERVE_SOAK_SECONDS=600 .venv/bin/python -m pytest -q tests/soak -s    # longer, with figures

For the duration, CONCURRENCY clients loop over a mix: native /generate and OpenAI completions and
chat, streaming or not, on a few shared system prompts with their own suffixes; 10% are cancelled
by the client itself (a stream left after its first 1-3 lines, a plain request's task cancelled at
a random moment), 5% are invalid (they must get a 400: among them a request's own chat template,
`apply_chat_template` parameters and tool-call arguments nested 50k deep or holding a lone
surrogate), 3% come from a foreign web page (a 403), 5% reuse the client's own rid right after
leaving a stream with it (served, or a 400 naming `rid` while the old one is still live), and a
few carry a grammar or a short deadline. The first requests of clients 0-2 are a foreign page's,
a rid reuse and an invalid one, so that each kind the end checks count is sent even when a loaded
machine lets little traffic through.
The server is small on purpose (8 running, 2 queued, for 12 clients) so admission control refuses
some with 503 (the run's `small_server`, tests/conftest.py, shared with test_structured_outputs and
test_http_server).
At the end: no 5xx other than those 503s, no client-side timeout (a request the server never
finished is a failure, never a "cancel"), every valid request answered (or refused with 503) or
cancelled by its client, the scheduler idle with its integrity check passing, every
request row free, the KV pool all free or evictable, the main process holding no request (its
maps, the detokenizer's decode states and the metrics' per-request map all empty, and a batch of
max-running + max-queued prompts admitted), and the server's memory grown by less than
RSS_GROWTH_LIMIT (a coarse bound against runaway growth: over a few seconds it cannot see a slow
per-request leak; the checks of what is held are what prove that).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import time
from collections import Counter
from typing import Any

import aiohttp
import pytest
import requests

from tests.tokenizer.http_helpers import RunningServer, server_state, wait_until

pytestmark = pytest.mark.slow

SOAK_SECONDS = float(os.environ.get("RADIXSERVE_SOAK_SECONDS", "8"))
WARMUP_SECONDS = 2.0
CONCURRENCY = 12
RSS_GROWTH_LIMIT = 300 * 2**20  # bytes, over the whole process tree
SYSTEMS = ["You are a helpful assistant. Answer briefly. " * 8, "You translate English to French. " * 10,
           "List facts about the ocean, one per line. " * 6]
INVALID = [  # (path, body): each must be a 400
    ("/generate", {"text": "hi", "sampling_params": {"temperature": -1}}),
    ("/generate", {"text": "", "sampling_params": {"max_new_tokens": 4}}),
    ("/v1/completions", {"model": "m", "prompt": "hi", "max_tokens": -5}),
    ("/v1/chat/completions", {"model": "m", "messages": [], "max_tokens": 4}),
    ("/generate", {"text": "hi", "sampling_params": {"regex": "[unclosed"}}),
    ("/generate", {"text": "hi", "timeout": -1}),
    ("/v1/chat/completions", {"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}],
                              "chat_template_kwargs": {"chat_template": "{{ messages[0].content }}"}}),
    ("/v1/chat/completions", {"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}],
                              "chat_template_kwargs": {"tokenize": True}}),
]
TOOL_TURN = ('{"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}, {"role": "assistant", '
             '"tool_calls": [{"id": "c", "type": "function", "function": {"name": "f", "arguments": "ARGS"}}]}, '
             '{"role": "tool", "tool_call_id": "c", "content": "ok"}]}')
RAW_INVALID = [  # raw bytes: each must be a 400
    TOOL_TURN.replace("ARGS", "[" * 50_000 + "]" * 50_000).encode(),  # arguments nested 50k deep
    TOOL_TURN.replace("ARGS", r'{\"x\": \"\\ud800\"}').encode(),  # arguments {"x": "\ud800"}: a lone surrogate
]
FOREIGN = {"Origin": "http://evil.example"}
# The rolls `_one` maps to a foreign page, a rid reuse and an invalid request: the first requests
# of clients 0-2 (see the module docstring).
FIRST_ROLLS = (0.0, 0.05, 0.10)


@pytest.fixture(scope="module")
def server(small_server: RunningServer) -> RunningServer:
    return small_server


def tree_rss(pid: int) -> int:
    """Resident bytes of a process and all its descendants (read from /proc)."""
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as fh:
                    parents[int(entry)] = int(fh.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
    tree, frontier = {pid}, [pid]
    while frontier:
        parent = frontier.pop()
        children = [p for p, pp in parents.items() if pp == parent and p not in tree]
        tree.update(children)
        frontier += children
    total = 0
    for p in tree:
        try:
            with open(f"/proc/{p}/status") as fh:
                total += next(int(line.split()[1]) * 1024 for line in fh if line.startswith("VmRSS:"))
        except (OSError, StopIteration):
            continue
    return total


def _valid_request(rng: random.Random) -> tuple[str, dict[str, Any]]:
    system = rng.choice(SYSTEMS)
    suffix = f" Question {rng.randrange(10**6)}: what is {rng.randrange(100)} plus {rng.randrange(100)}?"
    tokens = rng.choice([4, 8, 16, 32])
    stream = rng.random() < 0.5
    kind = rng.choice(["native", "completion", "chat"])
    extra: dict[str, Any] = {}
    roll = rng.random()
    if roll < 0.05:
        extra["timeout"] = 0.2  # may end with finish_reason abort (its deadline)
    if kind == "native":
        params: dict[str, Any] = {"max_new_tokens": tokens, "temperature": rng.choice([0, 0.7])}
        if 0.05 <= roll < 0.10:
            params["regex"] = "[0-9]{1,4}"
        return "/generate", {"text": system + suffix, "sampling_params": params, "stream": stream, **extra}
    if kind == "completion":
        return "/v1/completions", {"model": "m", "prompt": system + suffix, "max_tokens": tokens, "stream": stream,
                                   "temperature": 0, **extra}
    body = {"model": "m", "messages": [{"role": "system", "content": system}, {"role": "user", "content": suffix}],
            "max_tokens": tokens, "stream": stream, **extra}
    if 0.05 <= roll < 0.10:
        body["response_format"] = {"type": "json_object"}
    return "/v1/chat/completions", body


def _outcome(path: str, stream: bool, text: str) -> str:
    """"answered" when the body (or the stream, ended by [DONE]) carries a finish reason; else
    what went wrong (a stream's error event counts by its code)."""
    if not stream:
        body = json.loads(text)
        if path == "/generate":
            done = body["meta_info"]["finish_reason"] is not None
        else:
            done = all(c["finish_reason"] is not None for c in body["choices"])
        return "answered" if done else "unfinished_200"
    events = [line[6:] for line in text.splitlines() if line.startswith("data: ")]
    if not events or events[-1] != "[DONE]":
        return "unfinished_stream"
    chunks = [json.loads(e) for e in events[:-1]]
    errors = [c["error"]["code"] for c in chunks if "error" in c]
    if errors:
        return f"stream_error_{errors[0]}"
    if path == "/generate":
        done = bool(chunks) and chunks[-1]["meta_info"]["finish_reason"] is not None
    else:
        done = any(ch.get("finish_reason") is not None for c in chunks for ch in c.get("choices", []))
    return "answered" if done else "unfinished_stream"


async def _one(session: aiohttp.ClientSession, url: str, rng: random.Random, tally: Counter, rid: str,
               first: float | None = None) -> None:
    """One request (two for a rid reuse) of the mix; `first`, if given, is the roll that picks its kind."""
    roll = rng.random() if first is None else first
    if roll < 0.03:
        return await _foreign_page(session, url, rng, tally)
    if roll < 0.08:
        return await _reuse_rid(session, url, rng, tally, rid)
    if roll < 0.13:
        raw = rng.random() < 0.3
        path, body = ("/v1/chat/completions", rng.choice(RAW_INVALID)) if raw else rng.choice(INVALID)
        send = dict(data=body, headers={"Content-Type": "application/json"}) if raw else dict(json=body)
        async with session.post(url + path, **send) as resp:
            await resp.read()
        if resp.status == 503:  # admission control sheds load before looking at the body
            assert resp.headers.get("Retry-After") == "1"
            tally["invalid_rejected_503"] += 1
            await asyncio.sleep(rng.uniform(0.1, 0.5))  # a well-behaved client backs off (shortened)
        else:
            tally["invalid_400" if resp.status == 400 else f"invalid_got_{resp.status}"] += 1
        return
    path, body = _valid_request(rng)
    cancel = rng.random() < 0.10
    try:
        if cancel and body["stream"]:
            status, text = await _read_then_leave(session, url + path, body, rng.randrange(1, 4), tally)
        elif cancel:
            status, text = await _send_then_cancel(session, url + path, body, rng.uniform(0.0, 0.5), tally)
        else:
            status, text = await _send(session, url + path, body)
    except TimeoutError:  # aiohttp's own total timeout: the server never finished this request
        tally["client_timeout"] += 1
        return
    if status is None:
        return  # cancelled by this client (counted)
    if status == 200:
        tally[_outcome(path, body.get("stream", False), text)] += 1
    elif status == 503:
        tally["rejected_503"] += 1
        await asyncio.sleep(rng.uniform(0.1, 0.5))  # as after an invalid one's 503
    else:
        tally[f"status_{status}"] += 1


async def _foreign_page(session: aiohttp.ClientSession, url: str, rng: random.Random, tally: Counter) -> None:
    """What a web page could send: a generation, abort_all or a cache flush, from its Origin."""
    path, body = rng.choice([("/generate", {"text": "hi", "sampling_params": {"max_new_tokens": 2}}),
                             ("/abort_request", {"abort_all": True}), ("/flush_cache", {})])
    async with session.post(url + path, data=json.dumps(body).encode(), headers=FOREIGN) as resp:
        await resp.read()
    tally["foreign_403" if resp.status == 403 else f"foreign_got_{resp.status}"] += 1


async def _reuse_rid(session: aiohttp.ClientSession, url: str, rng: random.Random, tally: Counter, rid: str) -> None:
    """Leave a stream with this client's own rid after one line, then send that rid again at once
    (two requests): served, or a 400 naming `rid` while the old one is still live, never a crash."""
    body = {"text": rng.choice(SYSTEMS), "rid": rid, "stream": True, "sampling_params": {"max_new_tokens": 64}}
    status, text = await _read_then_leave(session, url + "/generate", body, 1, tally)
    if status is not None:
        tally[_outcome("/generate", True, text) if status == 200 else _rid_outcome(status, text)] += 1
    tally["sent"] += 1  # the first of the two (the caller counts the second)
    again = {**body, "stream": False, "sampling_params": {"max_new_tokens": 4}}
    status, text = await _send(session, url + "/generate", again)
    tally[_outcome("/generate", False, text) if status == 200 else _rid_outcome(status, text)] += 1


def _rid_outcome(status: int, text: str) -> str:
    if status == 503:
        return "rejected_503"
    if status == 400 and json.loads(text)["error"]["param"] == "rid":
        return "rid_busy_400"
    return f"status_{status}"


async def _send(session: aiohttp.ClientSession, url: str, body: dict[str, Any]) -> tuple[int, str]:
    async with session.post(url, json=body) as resp:
        if resp.status == 503:
            assert resp.headers.get("Retry-After") == "1"
        return resp.status, await resp.text()


async def _read_then_leave(session: aiohttp.ClientSession, url: str, body: dict[str, Any], lines: int,
                           tally: Counter) -> tuple[int | None, str]:
    """Read `lines` lines of the stream, then close the connection: a cancel by the client (None)
    unless the stream had already ended (its status and text are returned then)."""
    async with session.post(url, json=body) as resp:
        if resp.status != 200:
            return resp.status, await resp.text()
        seen = []
        while len(seen) < lines:
            line = await resp.content.readline()
            if not line:  # the whole stream came first
                return resp.status, "".join(seen)
            seen.append(line.decode())
        resp.close()
    tally["cancelled"] += 1
    return None, ""


async def _send_then_cancel(session: aiohttp.ClientSession, url: str, body: dict[str, Any], after: float,
                            tally: Counter) -> tuple[int | None, str]:
    """Cancel the request's task `after` seconds in (None), unless it was answered first."""
    task = asyncio.create_task(_send(session, url, body))
    done, _ = await asyncio.wait({task}, timeout=after)
    if done:
        return task.result()
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    tally["cancelled"] += 1
    return None, ""


async def _soak(url: str, seconds: float) -> Counter:
    tally: Counter = Counter()
    end = time.monotonic() + seconds

    async def client(seed: int) -> None:
        rng = random.Random(seed)
        timeout = aiohttp.ClientTimeout(total=120)
        first = FIRST_ROLLS[seed] if seed < len(FIRST_ROLLS) else None
        async with aiohttp.ClientSession(timeout=timeout) as session:
            while time.monotonic() < end:
                await _one(session, url, rng, tally, f"soak-client-{seed}", first)
                tally["sent"] += 1
                first = None

    await asyncio.gather(*(client(i) for i in range(CONCURRENCY)))
    return tally


def assert_no_request_held(server: RunningServer) -> None:
    """The main process holds no request: admission counts every request it still tracks
    (TokenizerManager.rid_to_state) plus reservations against max_running + max_queued, so a
    batch of exactly that many prompts is admitted only if none is left over."""
    info = requests.get(server.url + "/get_server_info", timeout=30).json()
    assert set(info["tokenizer_state"].values()) == {0}, info["tokenizer_state"]
    capacity = info["max_running_requests"] + info["max_queued_requests"]
    body = {"text": [f"Say {i}." for i in range(capacity)], "sampling_params": {"max_new_tokens": 1}}
    resp = requests.post(server.url + "/generate", json=body, timeout=120)
    assert resp.status_code == 200, (capacity, resp.status_code, resp.text)


def test_soak_mixed_traffic_loses_nothing(server: RunningServer) -> None:
    # A warm-up first: the grammar helpers (validation, compilation: ~330 MB each, started by the
    # first grammar request) and the caches are not growth.
    for body in ({"text": "1+1=", "sampling_params": {"max_new_tokens": 2, "regex": "[0-9]"}},):
        assert requests.post(server.url + "/generate", json=body, timeout=120).status_code == 200
    asyncio.run(_soak(server.url, WARMUP_SECONDS))
    wait_until(lambda: (lambda s: s["running"] == 0 and s["waiting"] == 0)(server_state(server)), "idle", 60)
    rss_before = tree_rss(server.process.pid)
    tally = asyncio.run(_soak(server.url, SOAK_SECONDS))
    wait_until(lambda: (lambda s: s["running"] == 0 and s["waiting"] == 0)(server_state(server)), "idle", 60)
    state = server_state(server)
    rss_after = tree_rss(server.process.pid)
    figures = {**tally, "seconds": SOAK_SECONDS, "rss_before_mb": rss_before >> 20, "rss_after_mb": rss_after >> 20,
               "kv_total": state["kv_total"], "kv_available": state["kv_available"],
               "kv_evictable": state["kv_evictable"], "deadline_expired": state["deadline_expired"]}
    print("soak:", json.dumps(figures))
    bad_prefixes = ("status_", "invalid_got_", "unfinished_", "stream_error_", "client_timeout", "foreign_got_")
    bad = {k: v for k, v in tally.items() if k.startswith(bad_prefixes)}
    assert bad == {}, figures  # no 5xx (other than admission's 503), every invalid one a 400
    assert tally["answered"] > 0 and tally["invalid_400"] > 0 and tally["foreign_403"] > 0, figures
    assert tally["sent"] == sum(tally[k] for k in ("answered", "rejected_503", "cancelled", "invalid_400",
                                                    "invalid_rejected_503", "foreign_403", "rid_busy_400"))
    assert state["integrity"] == "ok" and state["rows_free"] == state["rows_total"], state
    assert state["kv_available"] + state["kv_evictable"] == state["kv_total"], state  # nothing held
    assert_no_request_held(server)
    assert rss_after - rss_before < RSS_GROWTH_LIMIT, figures
    assert requests.get(server.url + "/health", timeout=10).status_code == 200
