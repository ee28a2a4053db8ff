"""Soak: mixed traffic against the real server for a while, then prove nothing was lost.

    make test                                        # SOAK_SECONDS (8 s) as part of the suite
    RADIXSERVE_SOAK_SECONDS=600 .venv/bin/python -m pytest -q tests/soak -s    # longer, with figures

For the duration, CONCURRENCY clients loop over a mix: native /generate and OpenAI completions and
chat, streaming or not, on a few shared system prompts with their own suffixes; 10% are cancelled
at a random moment (the connection closed mid-stream or before the answer), 5% are invalid (they
must get a 400), a few carry a grammar or a short deadline. The server is small on purpose
(8 running, 2 queued, for 12 clients) so admission control refuses some with 503. At the end: no 5xx other than
those 503s, every valid request answered (or refused with 503) or cancelled, the scheduler idle
with its integrity check passing, every request row free, the KV pool all free or evictable, and
the server's memory grown by less than RSS_GROWTH_LIMIT.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import time
from collections import Counter
from collections.abc import Iterator
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
]


@pytest.fixture(scope="module")
def server(default_model_path: str) -> Iterator[RunningServer]:
    running = RunningServer.start(default_model_path, "--max-running-requests", "8", "--max-queued-requests", "2",
                                  "--chunked-prefill-size", "128", "--drain-timeout", "2")
    yield running
    running.stop()


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


async def _one(session: aiohttp.ClientSession, url: str, rng: random.Random, tally: Counter) -> None:
    if rng.random() < 0.05:
        path, body = rng.choice(INVALID)
        async with session.post(url + path, json=body) as resp:
            await resp.read()
        if resp.status == 503:  # admission control sheds load before looking at the body
            tally["invalid_rejected_503"] += 1
            await _back_off(resp, rng)
        else:
            tally["invalid_400" if resp.status == 400 else f"invalid_got_{resp.status}"] += 1
        return
    path, body = _valid_request(rng)
    cancel_after = rng.uniform(0.0, 0.5) if rng.random() < 0.10 else None
    try:
        async with asyncio.timeout(cancel_after):
            async with session.post(url + path, json=body) as resp:
                text = await resp.text()
    except TimeoutError:
        tally["cancelled"] += 1
        return
    if resp.status == 200:
        tally[_outcome(path, body.get("stream", False), text)] += 1
    elif resp.status == 503:
        tally["rejected_503"] += 1
        await _back_off(resp, rng)
    else:
        tally[f"status_{resp.status}"] += 1


async def _back_off(resp: aiohttp.ClientResponse, rng: random.Random) -> None:
    """What a well-behaved client does on 503: wait (Retry-After, shortened to keep the load up)."""
    assert resp.headers.get("Retry-After") == "1"
    await asyncio.sleep(rng.uniform(0.1, 0.5))


async def _soak(url: str, seconds: float) -> Counter:
    tally: Counter = Counter()
    end = time.monotonic() + seconds

    async def client(seed: int) -> None:
        rng = random.Random(seed)
        timeout = aiohttp.ClientTimeout(total=120)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            while time.monotonic() < end:
                await _one(session, url, rng, tally)
                tally["sent"] += 1

    await asyncio.gather(*(client(i) for i in range(CONCURRENCY)))
    return tally


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
    bad = {k: v for k, v in tally.items() if k.startswith(("status_", "invalid_got_", "unfinished_", "stream_error_"))}
    assert bad == {}, figures  # no 5xx (other than admission's 503), every invalid one a 400
    assert tally["answered"] > 0 and tally["invalid_400"] > 0, figures
    assert tally["sent"] == sum(tally[k] for k in ("answered", "rejected_503", "cancelled", "invalid_400",
                                                    "invalid_rejected_503"))
    assert state["integrity"] == "ok" and state["rows_free"] == state["rows_total"], state
    assert state["kv_available"] + state["kv_evictable"] == state["kv_total"], state  # nothing held
    assert rss_after - rss_before < RSS_GROWTH_LIMIT, figures
    assert requests.get(server.url + "/health", timeout=10).status_code == 200
