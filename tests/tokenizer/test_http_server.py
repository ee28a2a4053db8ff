"""The real server over HTTP (the run's `small_server`, tests/conftest.py: model name "smol",
priority scheduling, a 4 s drain): the official `openai` client, the native /generate API,
disconnect-abort, /metrics, and the SIGTERM drain (last: it stops the server)."""

from __future__ import annotations

import http.client
import json
import logging
import os
import signal
import socket
import threading
from collections.abc import Callable

import openai
import pytest
import requests

from tests.tokenizer.http_helpers import (
    SMALL_SERVER_DRAIN_S,
    RunningServer,
    post,
    server_state,
    sse_events,
    wait_idle,
    wait_until,
)

pytestmark = pytest.mark.slow

GREEDY = {"temperature": 0}
LONG = {"max_new_tokens": 1500, "ignore_eos": True}


@pytest.fixture(scope="module")
def server(small_server: RunningServer) -> RunningServer:
    return small_server


@pytest.fixture(scope="module")
def client(server: RunningServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=60)


CHAT = [{"role": "user", "content": "Name three colors."}]


def test_models(client: openai.OpenAI) -> None:
    models = client.models.list().data
    assert [m.id for m in models] == ["smol"]


def test_chat_stream_joins_to_the_non_streamed_text(client: openai.OpenAI) -> None:
    full = client.chat.completions.create(model="smol", messages=CHAT, max_tokens=12, temperature=0)
    assert full.id.startswith("chatcmpl-") and full.model == "smol"
    text = full.choices[0].message.content
    assert text and full.choices[0].finish_reason in ("stop", "length")
    assert full.usage.prompt_tokens > 0 and full.usage.completion_tokens <= 12
    stream = client.chat.completions.create(
        model="smol", messages=CHAT, max_tokens=12, temperature=0, stream=True,
        stream_options={"include_usage": True})
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    joined = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert joined == text
    assert chunks[-1].choices == []
    assert chunks[-1].usage.completion_tokens == full.usage.completion_tokens
    reasons = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert reasons[-1] == full.choices[0].finish_reason


def test_chat_n_stop_and_logprobs(client: openai.OpenAI) -> None:
    out = client.chat.completions.create(model="smol", messages=CHAT, max_tokens=6, n=2,
                                         temperature=0.8, seed=7, logprobs=True, top_logprobs=3)
    assert [c.index for c in out.choices] == [0, 1]
    for choice in out.choices:
        content = choice.logprobs.content
        assert 1 <= len(content) <= 6
        assert all(len(t.top_logprobs) == 3 and t.logprob <= 0 for t in content)
    greedy = client.chat.completions.create(model="smol", messages=CHAT, max_tokens=12,
                                            temperature=0)
    words = greedy.choices[0].message.content.split()
    assert len(words) >= 2
    stopped = client.chat.completions.create(model="smol", messages=CHAT, max_tokens=12,
                                             temperature=0, stop=[words[1]])
    assert stopped.choices[0].finish_reason == "stop"
    assert words[1] not in stopped.choices[0].message.content


def test_completions_batch_echo_logprobs_and_stream(client: openai.OpenAI) -> None:
    out = client.completions.create(model="smol", prompt=["Once upon a time", "1, 2, 3,"],
                                    max_tokens=5, temperature=0, echo=True, logprobs=2)
    assert out.id.startswith("cmpl-") and len(out.choices) == 2
    assert out.choices[1].text.startswith("1, 2, 3,")
    lp = out.choices[0].logprobs
    assert lp.token_logprobs[0] is None and len(lp.tokens) == len(lp.token_logprobs)
    assert "".join(lp.tokens) == out.choices[0].text
    single = client.completions.create(model="smol", prompt="1, 2, 3,", max_tokens=5, temperature=0)
    stream = client.completions.create(model="smol", prompt="1, 2, 3,", max_tokens=5, temperature=0,
                                       stream=True, stream_options={"include_usage": True})
    chunks = list(stream)
    assert "".join(c.choices[0].text for c in chunks if c.choices) == single.choices[0].text
    assert chunks[-1].usage.completion_tokens == single.usage.completion_tokens


def test_cached_tokens_on_a_repeated_long_prompt(client: openai.OpenAI) -> None:
    prompt = "The history of the printing press begins " + "long ago and far away " * 40
    first = client.completions.create(model="smol", prompt=prompt, max_tokens=2, temperature=0)
    second = client.completions.create(model="smol", prompt=prompt, max_tokens=2, temperature=0)
    assert second.usage.prompt_tokens > 100
    assert second.usage.prompt_tokens_details.cached_tokens >= second.usage.prompt_tokens - 2
    assert first.choices[0].text == second.choices[0].text


def test_cache_salts_keep_tenants_apart(client: openai.OpenAI, server: RunningServer) -> None:
    """OpenAI `cache_salt` / `extra_key` and the native `extra_key` name one namespace each:
    a prompt cached under one salt is not a hit under another, nor without one."""
    prompt = "Tenant notes: the quarterly figures " + "are confidential and stay in house " * 30

    def cached(**extra: str) -> int:
        out = client.completions.create(model="smol", prompt=prompt, max_tokens=1, temperature=0,
                                        extra_body=extra or None)
        return out.usage.prompt_tokens_details.cached_tokens

    assert cached(cache_salt="tenant-a") == 0
    assert cached(cache_salt="tenant-a") > 100  # the same tenant hits its own prefix
    assert cached(cache_salt="tenant-b") == 0 and cached() == 0
    assert cached(extra_key="tenant-a") > 100  # SGLang's name for the same namespace
    native = requests.post(server.url + "/generate", timeout=60, json={
        "text": prompt, "extra_key": "tenant-c", "sampling_params": {"max_new_tokens": 1}}).json()
    assert native["meta_info"]["cached_tokens"] == 0
    bad = requests.post(server.url + "/v1/completions", timeout=60,
                        json={"model": "smol", "prompt": "x", "cache_salt": 7})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "cache_salt"


def test_priorities_on_both_apis_and_their_metrics(client: openai.OpenAI, server: RunningServer) -> None:
    """`priority` on /generate and the OpenAI routes (a 400 naming it when not an integer), and the
    per-priority queue-time and TTFT histograms, read with prometheus_client's parser."""
    from prometheus_client.parser import text_string_to_metric_families

    chat = client.chat.completions.create(model="smol", messages=CHAT, max_tokens=3, extra_body={"priority": 7})
    assert chat.usage.completion_tokens == 3
    native = requests.post(server.url + "/generate", timeout=60, json={
        "text": "Hi", "priority": -2, "sampling_params": {"max_new_tokens": 2}})
    assert native.status_code == 200
    bad = requests.post(server.url + "/generate", timeout=60, json={"text": "Hi", "priority": "high"})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "priority"
    families = {f.name: f for f in text_string_to_metric_families(requests.get(server.url + "/metrics").text)}
    for name in ("radixserve:priority_queue_time_seconds", "radixserve:priority_time_to_first_token_seconds"):
        counts = {s.labels["priority"]: s.value for s in families[name].samples if s.name.endswith("_count")}
        assert counts.get("7") == 1 and counts.get("-2") == 1, (name, counts)
    assert families["radixserve:queue_time_seconds"].type == "histogram"
    # prometheus_client's parser names a counter family without its _total suffix
    assert {"radixserve:num_retracted_requests", "radixserve:num_preempted_requests"} <= set(families)


def test_tokenize_counts_what_generate_counts_and_detokenize_inverts_it(server: RunningServer) -> None:
    text = "Agents count their history before they send it."
    one = requests.post(server.url + "/tokenize", json={"prompt": text}, timeout=30).json()
    generated = post(server, "/generate", {"text": text, "sampling_params": {"max_new_tokens": 1}}).json()
    prompt_tokens = generated["meta_info"]["prompt_tokens"]
    assert one["count"] == len(one["tokens"]) == prompt_tokens and one["max_model_len"] == 2048
    body = {"model": "smol", "prompt": [text, "hi"]}
    batch = requests.post(server.url + "/v1/tokenize", json=body, timeout=30).json()
    assert batch["tokens"][0] == one["tokens"] and batch["count"] == [one["count"], len(batch["tokens"][1])]
    back = requests.post(server.url + "/detokenize", json={"tokens": one["tokens"]}, timeout=30).json()
    assert back["text"] == text
    for path, body, param in [("/tokenize", {"prompt": 5}, "prompt"), ("/detokenize", {"tokens": [-1]}, "tokens[0]"),
                              ("/detokenize", {"tokens": [10**9]}, "tokens")]:
        bad = requests.post(server.url + path, json=body, timeout=30)
        assert bad.status_code == 400 and bad.json()["error"]["param"] == param


def test_native_generate_stream_batch_and_logprobs(server: RunningServer) -> None:
    body = {"text": "The capital of France is", "sampling_params": {"max_new_tokens": 8, **GREEDY}}
    full = post(server, "/generate", body).json()
    with requests.post(server.url + "/generate", json={**body, "stream": True}, stream=True,
                       timeout=60) as resp:
        events = list(sse_events(resp))
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert chunks[-1]["text"] == full["text"] and chunks[-1]["output_ids"] == full["output_ids"]
    batch = post(server, "/generate", {"text": ["Hello", "Goodbye"],
                                       "sampling_params": {"max_new_tokens": 3, **GREEDY},
                                       "return_logprob": True, "top_logprobs_num": 2}).json()
    assert len(batch) == 2
    meta = batch[0]["meta_info"]
    assert len(meta["output_token_logprobs"]) == 3 and len(meta["output_top_logprobs"][0]) == 2


def test_native_info_routes(server: RunningServer) -> None:
    info = requests.get(server.url + "/get_model_info", timeout=10).json()
    assert info["is_generation"] is True and os.path.isdir(info["model_path"])
    assert info["model_type"] == "llama" and info["architectures"] == ["LlamaForCausalLM"]
    server_info = requests.get(server.url + "/get_server_info", timeout=10).json()
    assert "api_key" not in server_info and server_info["internal_states"][0]["integrity"] == "ok"
    assert server_info["max_total_num_tokens"] == server_info["max_total_tokens"] > 0  # SGLang's names
    assert server_info["max_req_input_len"] == 2047
    assert server_info["internal_states"][0]["last_gen_throughput"] >= 0
    assert requests.get(server.url + "/health_generate", timeout=30).status_code == 200
    assert requests.post(server.url + "/flush_cache", timeout=30).text == "Cache flushed."
    # sglang-router's load monitor: one data-parallel rank, idle.
    load = requests.get(server.url + "/get_load", timeout=10).json()
    assert load == [{"dp_rank": 0, "num_reqs": 0, "num_waiting_reqs": 0, "num_tokens": 0}]


def test_http2_probes_get_a_400_and_no_error_log(server: RunningServer) -> None:
    """sglang-router opens each worker with an HTTP/2 preface (a gRPC probe) before HTTP/1.1."""
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        sock.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
        assert sock.recv(64).startswith(b"HTTP/1.0 400")
    from aiohttp.http_exceptions import BadHttpMessage

    from tokenizer.lifecycle import Http2ProbeFilter

    probe = logging.LogRecord("aiohttp.server", logging.ERROR, "", 0, "Error handling request", None,
                              (BadHttpMessage, BadHttpMessage("Pause on PRI/Upgrade:"), None))
    other = logging.LogRecord("aiohttp.server", logging.ERROR, "", 0, "Error handling request", None,
                              (BadHttpMessage, BadHttpMessage("Invalid method"), None))
    assert not Http2ProbeFilter().filter(probe) and Http2ProbeFilter().filter(other)


def _stream_then_disconnect(server: RunningServer, path: str, body: dict) -> None:
    """Read a few SSE events, then close the connection (leaving the `with` closes the socket,
    as the body was not read to the end)."""
    with requests.post(server.url + path, json=body, stream=True, timeout=60) as resp:
        assert resp.status_code == 200
        for n, _ in enumerate(resp.iter_lines()):
            if n >= 6:
                break


def _plain_then_disconnect(server: RunningServer, path: str, body: dict) -> None:
    """Send a non-streamed request, wait until the scheduler runs it, then close the socket."""
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
    conn.request("POST", path, body=json.dumps(body), headers={"Content-Type": "application/json"})
    wait_until(lambda: server_state(server)["running"] > 0, "the request to run")
    conn.close()


@pytest.mark.parametrize("leave, path, body", [
    (_stream_then_disconnect, "/generate", {"text": "Count:", "stream": True, "sampling_params": LONG}),
    (_stream_then_disconnect, "/v1/chat/completions",
     {"messages": CHAT, "stream": True, "max_tokens": 1500, "ignore_eos": True}),
    (_plain_then_disconnect, "/v1/completions", {"prompt": "Count:", "max_tokens": 1500, "ignore_eos": True}),
], ids=["native-stream", "chat-stream", "completions-plain"])
def test_disconnect_aborts_streamed_and_plain_requests(server: RunningServer, leave: Callable[..., None], path: str,
                                                       body: dict) -> None:
    """A request of 1500 tokens, left by its client while running, is aborted: the scheduler's
    own forward count (one forward per token at least, for a request that runs to the end)
    stays under 1500 from before it came until the scheduler is idle again, and it frees
    everything it held. The idle wait's deadline only bounds a failure: a request that is not
    aborted either finishes within it (and fails the count) or does not (and fails the wait)."""
    start = wait_idle(server)["forward_count"]
    leave(server, path, body)
    state = wait_idle(server, timeout=180)
    assert state["forward_count"] - start < LONG["max_new_tokens"], (start, state)
    assert state["integrity"] == "ok" and state["rows_free"] == state["rows_total"]
    ok = post(server, "/generate", {"text": "Hi", "sampling_params": {"max_new_tokens": 2}})
    assert ok.status_code == 200


def test_abort_request_by_rid(server: RunningServer) -> None:
    result: dict = {}
    body = {"text": "Count:", "rid": "to-abort", "sampling_params": LONG}
    worker = threading.Thread(target=lambda: result.update(post(server, "/generate", body).json()))
    worker.start()
    wait_until(lambda: server_state(server)["running"] > 0, "the request to run")
    assert post(server, "/abort_request", {"rid": "to-abort"}).json()["success"] is True
    worker.join(30)
    assert result["meta_info"]["finish_reason"]["type"] == "abort"


def test_metrics(server: RunningServer) -> None:
    text = requests.get(server.url + "/metrics", timeout=10).text
    for name in ("num_running_reqs", "num_queue_reqs", "token_usage", "cache_hit_rate",
                 "gen_throughput", "prompt_tokens_total", "generation_tokens_total",
                 "cached_tokens_total", "num_requests_total", "time_to_first_token_seconds_bucket",
                 "inter_token_latency_seconds_count", "e2e_request_latency_seconds_sum"):
        assert f"radixserve:{name}" in text, name
    assert 'model_name="smol"' in text


def test_http_abort_all_ends_every_request(server: RunningServer) -> None:
    results: list[dict] = []
    body = {"sampling_params": {"max_new_tokens": 1500, "ignore_eos": True}}
    workers = [threading.Thread(target=lambda i=i: results.append(
        post(server, "/generate", {"text": f"Count {i}:", **body}).json())) for i in range(3)]
    for w in workers:
        w.start()
    wait_until(lambda: server_state(server)["running"] == 3, "three requests to run")
    assert post(server, "/abort_request", {"abort_all": True}).json() == {"success": True, "abort_all": True}
    for w in workers:
        w.join(60)
    assert [r["meta_info"]["finish_reason"]["type"] for r in results] == ["abort"] * 3
    state = server_state(server)
    assert state["running"] == 0 and state["integrity"] == "ok"


def test_a_request_past_its_timeout_ends_with_abort(server: RunningServer) -> None:
    """A top-level `timeout` (native, and OpenAI's body through extra_body) bounds a request
    server-side: it ends with finish_reason abort saying its deadline passed, nothing leaks."""
    expired_before = server_state(server)["deadline_expired"]
    long = {"max_new_tokens": 1500, "ignore_eos": True}
    out = post(server, "/generate", {"text": "Count:", "sampling_params": long, "timeout": 0.5}).json()
    finish = out["meta_info"]["finish_reason"]
    assert finish["type"] == "abort" and "deadline" in finish["message"], finish
    assert out["meta_info"]["completion_tokens"] < 1500
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0)
    reply = client.completions.create(model="smol", prompt="Count:", max_tokens=1500, extra_body={
        "ignore_eos": True, "timeout": 0.5})
    assert reply.choices[0].finish_reason == "abort"
    bad = post(server, "/generate", {"text": "hi", "timeout": -1})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "timeout"
    state = server_state(server)
    assert state["deadline_expired"] - expired_before >= 2 and state["integrity"] == "ok"


@pytest.mark.ends_server
def test_sigterm_drains_until_the_drain_timeout_then_exits_zero(server: RunningServer) -> None:
    """SIGTERM while a short (streamed) and a long request run: /health turns 503 and a new
    request gets a 503 error object; the short one, past its first token when the signal came,
    finishes normally within the drain; the long one (1500 tokens) is cut off when the drain
    times out (--drain-timeout SMALL_SERVER_DRAIN_S: ample for the short one's 15 tokens to go),
    not after its tokens, and its client gets an answer; the server exits 0. The log's drain
    lines count the requests in flight at its start and at its end."""
    answers: dict[str, requests.Response] = {}
    long_body = {"text": "Count:", "sampling_params": LONG}
    long = threading.Thread(target=lambda: answers.update(long=post(server, "/generate", long_body)))
    long.start()
    wait_until(lambda: server_state(server)["running"] == 1, "the long request to run")
    short_body = {"text": "Count to ten:", "stream": True,
                  "sampling_params": {"max_new_tokens": 16, "ignore_eos": True}}
    with requests.post(server.url + "/generate", json=short_body, stream=True, timeout=60) as short:
        events = sse_events(short)
        first = next(events)  # the short request runs: 15 tokens to go
        server.process.send_signal(signal.SIGTERM)
        wait_until(lambda: requests.get(server.url + "/health", timeout=10).status_code == 503, "draining")
        late = post(server, "/generate", long_body, timeout=10)
        assert late.status_code == 503 and "error" in late.json(), late.text
        assert late.headers["Retry-After"] == "1"
        rest = list(events)
    assert json.loads(first)["meta_info"]["finish_reason"] is None
    assert rest[-1] == "[DONE]" and json.loads(rest[-2])["meta_info"]["finish_reason"]["type"] == "length", rest[-2:]
    assert server.process.wait(60) == 0
    long.join(30)
    assert "long" in answers, "the long request's client got no answer"
    log = server.log()
    assert f"draining: 2 request(s) in flight, waiting up to {SMALL_SERVER_DRAIN_S} s" in log
    assert "drain timed out with 1 request(s) in flight" in log  # the long one; the short one had ended
    assert "server stopped (exit code 0)" in log
