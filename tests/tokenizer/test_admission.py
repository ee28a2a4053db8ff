"""Admission control against the real server (the run's `key_server`, tests/conftest.py: 2 running
and 1 queued request, 4 prompts per request, an API key): beyond what it admits a request gets
503 with Retry-After and is counted, nothing of it queued; a batch over the prompt cap is a 400;
long prompts are encoded off the event loop."""

from __future__ import annotations

import asyncio
import threading
import time

import openai
import pytest
import requests

from runtime.contracts.errors import InvalidRequest, Overloaded
from tests.tokenizer.http_helpers import (
    API_KEY,
    AUTH,
    RunningServer,
    post,
    server_state,
    wait_until,
)
from tokenizer.admission import OFFLOAD_TOKENIZE_CHARS, SHORT_LANE_CHARS, PromptEncoder, check_admission
from tokenizer.core.request import GenRequest, PromptRequest

LONG = {"sampling_params": {"max_new_tokens": 400, "ignore_eos": True}}
HELD = 3  # key_server's --max-running-requests 2 + --max-queued-requests 1
QUEUE_FULL = 'radixserve:num_rejected_requests_total{model_name="SmolLM2-135M-Instruct",reason="queue_full"}'


@pytest.fixture(scope="module")
def server(key_server: RunningServer) -> RunningServer:
    return key_server


def _queue_full(server: RunningServer) -> float:
    """The count of 503s for a full queue so far (0 before the first)."""
    metrics = requests.get(server.url + "/metrics", headers=AUTH, timeout=30).text
    return next((float(line.split()[-1]) for line in metrics.splitlines() if line.startswith(QUEUE_FULL + " ")), 0.0)


def test_a_batch_over_the_prompt_cap_is_a_400(server: RunningServer) -> None:
    resp = post(server, "/generate", {"text": ["a"] * 5, "sampling_params": {"max_new_tokens": 1}}, headers=AUTH)
    assert resp.status_code == 400 and resp.json()["error"]["param"] == "text", resp.text
    assert "at most 4" in resp.json()["error"]["message"]
    resp = post(server, "/v1/completions", {"model": "m", "prompt": ["a"] * 5, "max_tokens": 1}, headers=AUTH)
    assert resp.status_code == 400, resp.text
    ok = post(server, "/generate", {"text": ["a"] * 2, "sampling_params": {"max_new_tokens": 1}}, headers=AUTH)
    assert ok.status_code == 200


def test_beyond_running_plus_queued_is_a_503_with_retry_after(server: RunningServer) -> None:
    rejected_before = _queue_full(server)
    results: list[int] = []
    workers = [threading.Thread(target=lambda i=i: results.append(post(
        server, "/generate", {"text": f"Count {i}:", "rid": f"long{i}", **LONG}, headers=AUTH).status_code))
        for i in range(HELD)]
    for w in workers:
        w.start()
    wait_until(lambda: (lambda s: s["running"] + s["waiting"])(server_state(server, AUTH)) == HELD,
               "the requests held")
    refused = post(server, "/generate", {"text": "one more", "sampling_params": {"max_new_tokens": 1}}, headers=AUTH)
    assert refused.status_code == 503, refused.text
    assert refused.headers["Retry-After"] == "1"
    assert refused.json()["error"]["type"] == "service_unavailable_error"
    assert "capacity" in refused.json()["error"]["message"]
    client = openai.OpenAI(base_url=server.url + "/v1", api_key=API_KEY, max_retries=0)
    with pytest.raises(openai.InternalServerError) as err:  # the openai package retries these
        client.completions.create(model="m", prompt="hi", max_tokens=1)
    assert err.value.status_code == 503
    assert _queue_full(server) == rejected_before + 2
    for i in range(HELD):
        post(server, "/abort_request", {"rid": f"long{i}"}, headers=AUTH)
    for w in workers:
        w.join(60)
    assert sorted(results) == [200] * HELD
    state = server_state(server, AUTH)
    assert state["integrity"] == "ok" and state["running"] == 0 and state["waiting"] == 0
    again = post(server, "/generate", {"text": "again", "sampling_params": {"max_new_tokens": 1}}, headers=AUTH)
    assert again.status_code == 200


def test_a_request_that_could_never_be_held_is_a_400(server: RunningServer) -> None:
    """n=3 is three samples and a warm-up: four held requests, more than the three admitted at all."""
    body = {"text": "hi", "sampling_params": {"max_new_tokens": 1, "n": HELD}}
    resp = post(server, "/generate", body, headers=AUTH)
    assert resp.status_code == 400 and resp.json()["error"]["param"] == "sampling_params.n", resp.text


def test_long_prompts_are_encoded_off_the_event_loop() -> None:
    threads: list[str] = []

    class Recording:
        def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
            threads.append(threading.current_thread().name)
            return [len(text)]

    encoder = PromptEncoder(Recording())
    try:
        assert asyncio.run(encoder.encode_texts(["hi", "abc"])) == [[2], [3]]
        assert asyncio.run(encoder.encode_texts(["x" * OFFLOAD_TOKENIZE_CHARS])) == [[OFFLOAD_TOKENIZE_CHARS]]
        huge = SHORT_LANE_CHARS + 1  # one client's megabytes never queue ahead of a short chat
        assert asyncio.run(encoder.encode_texts(["y" * huge])) == [[huge]]
    finally:
        encoder.close()
    assert threads[:2] == ["MainThread", "MainThread"]
    assert threads[2].startswith("tokenize-short") and threads[3].startswith("tokenize-long")


def test_admission_rule() -> None:
    check_admission(held=3, count=2, max_held=5, field="text")
    with pytest.raises(Overloaded, match="at capacity"):
        check_admission(held=4, count=2, max_held=5, field="text")
    with pytest.raises(InvalidRequest) as err:
        check_admission(held=0, count=6, max_held=5, field="n")
    assert err.value.param == "n"


def test_the_server_default_timeout_becomes_a_deadline() -> None:
    """--request-timeout applies to a request without its own `timeout`; its own one wins."""
    from runtime.contracts.config import ServerConfig
    from tokenizer.labels import InternalRids
    from tokenizer.limits import RequestLimits
    from tokenizer.manager import TokenizerManager

    tm = object.__new__(TokenizerManager)  # only what _prepare reads
    tm._rids = InternalRids()
    tm.config = ServerConfig(model_path="/m", request_timeout=30.0)
    tm.limits = RequestLimits(vocab_size=100, context_length=512, kv_total=None, max_n=4, max_top_logprobs=5)

    def deadline(rid: str, timeout: float | None = None) -> float | None:
        prompt = PromptRequest([1, 2], rid, {})
        return tm._prepare(GenRequest([prompt], timeout=timeout), prompt, [1, 2]).req.deadline

    before = time.time()
    default = deadline("a")
    own = deadline("b", timeout=2.0)
    assert default is not None and before + 30 <= default <= time.time() + 30
    assert own is not None and before + 2 <= own <= time.time() + 2
    tm.config = ServerConfig(model_path="/m")
    assert deadline("c") is None
