"""The server as `make serve` starts it, with no flag at all: the shipped Q4_1 file's blocks on our
C++ kernels (the decode stack included), the CPU's own dtype, all cores, the default KV pool and
chunking. Its greedy tokens must not depend on how they are asked for: alone or in a batch,
streamed or not, a first time or again from the prefix cache, through the native API or the
official openai client.
"""

from __future__ import annotations

import json

import pytest
import requests
from openai import OpenAI

from runtime.execution.device import cpu_capability
from tests.tokenizer.http_helpers import RunningServer, post, sse_events, wait_idle

pytestmark = pytest.mark.slow

QUESTIONS = ["What is the capital of France?", "Write a haiku about the sea.",
             "List three uses of a paperclip.", "Name a prime number larger than ten."]
TOKENS = 24


def _generate(server: RunningServer, text: str | list[str], stream: bool = False) -> requests.Response:
    body = {"text": text, "stream": stream, "sampling_params": {"max_new_tokens": TOKENS, "temperature": 0}}
    return post(server, "/generate", body, stream=stream)


def test_it_serves_the_shipped_blocks_in_the_cpus_dtype(shipped_server: RunningServer) -> None:
    info = requests.get(shipped_server.url + "/get_server_info", timeout=30).json()
    assert info["load_format"] == "gguf" and str(info["gguf_file"]).endswith(".Q4_1.gguf")
    assert info["dtype"] == ("bfloat16" if cpu_capability().native_bf16 else "float32")
    assert info["num_threads"] is None and not info["enable_batch_variance"]
    engines = {(e["op"], e["engine"]) for e in info["engines"]}  # what the start-up log says too
    assert ("decode cascade", "off") in engines and ("prefill attention", "ours") in engines
    assert all(engine.startswith("blocks-") for op, engine in engines if op == "block GEMM")


def test_greedy_tokens_do_not_depend_on_how_they_are_asked_for(shipped_server: RunningServer) -> None:
    server = shipped_server
    alone = [_generate(server, q).json() for q in QUESTIONS]
    ids = [out["output_ids"] for out in alone]
    assert all(len(i) > 0 for i in ids)
    batched = _generate(server, QUESTIONS).json()
    assert [out["output_ids"] for out in batched] == ids
    again = [_generate(server, q).json() for q in QUESTIONS]  # now from the prefix cache
    assert [out["output_ids"] for out in again] == ids
    assert all(out["meta_info"]["cached_tokens"] > 0 for out in again)
    for question, out in zip(QUESTIONS, alone):
        with _generate(server, question, stream=True) as response:
            events = [json.loads(e) for e in sse_events(response) if e != "[DONE]"]
        assert events[-1]["text"] == out["text"]  # native chunks carry the cumulative text
        assert events[-1]["output_ids"] == out["output_ids"]
    assert wait_idle(server, timeout=60).get("integrity", "ok") == "ok"


def test_the_openai_client_gets_the_same_answer_streamed_or_not(shipped_server: RunningServer) -> None:
    client = OpenAI(base_url=shipped_server.url + "/v1", api_key="none")
    model = client.models.list().data[0].id
    for question in QUESTIONS[:2]:
        messages = [{"role": "user", "content": question}]
        whole = client.chat.completions.create(model=model, messages=messages, max_tokens=TOKENS, temperature=0)
        text = whole.choices[0].message.content
        assert text and whole.usage is not None and whole.usage.completion_tokens > 0
        stream = client.chat.completions.create(model=model, messages=messages, max_tokens=TOKENS, temperature=0,
                                                stream=True)
        assert "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices) == text
