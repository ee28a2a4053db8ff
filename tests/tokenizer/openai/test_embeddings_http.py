"""/v1/embeddings, /v1/rerank and /v1/score on the default decoder, through the real server and
OpenAI's own client: last-token pooling against Hugging Face, base64, `dimensions`, the radix
cache shared across inputs, and the routes' 400s naming their fields."""

from __future__ import annotations

import math
from typing import Any

import openai
import pytest
import requests
import torch
import transformers

from tests.tokenizer.http_helpers import RunningServer, post, wait_idle

HIDDEN = 576  # the default model's hidden size
TEXTS = ["The cat sat on the mat.", "Paris is the capital of France.", "x"]
PREFIX = "Radix trees share prefixes between requests, so a long common start is computed once. " * 12


@pytest.fixture(scope="module")
def client(shared_server: RunningServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=shared_server.url + "/v1", api_key="unused", max_retries=0, timeout=120)


def _embed(server: RunningServer, body: dict[str, Any]) -> dict[str, Any]:
    resp = post(server, "/v1/embeddings", body)
    assert resp.status_code == 200, resp.text
    out: dict[str, Any] = resp.json()
    return out


def _norm(v: list[float]) -> float:
    return math.sqrt(sum(x * x for x in v))


def test_the_openai_client_decodes_our_base64_to_the_float_answer(client: openai.OpenAI,
                                                                   shared_server: RunningServer) -> None:
    reply = client.embeddings.create(model="m", input=TEXTS)  # the client asks for base64 and decodes it
    assert [d.index for d in reply.data] == [0, 1, 2] and reply.object == "list"
    floats = _embed(shared_server, {"input": TEXTS, "encoding_format": "float"})
    for got, want in zip(reply.data, floats["data"]):
        assert len(got.embedding) == HIDDEN and math.isclose(_norm(got.embedding), 1.0, rel_tol=1e-5)
        # float32 on the wire; the second request reads the first's prompts from the radix cache
        assert got.embedding == pytest.approx(want["embedding"], abs=1e-5)
    assert reply.usage.prompt_tokens == reply.usage.total_tokens == floats["usage"]["prompt_tokens"] > 3


def test_last_token_pooling_is_hugging_faces_final_hidden_state(client: openai.OpenAI,
                                                                default_model_path: str,
                                                                default_tokenizer: Any) -> None:
    ids = [default_tokenizer.encode(t) for t in TEXTS[:2]]
    reply = client.embeddings.create(model="m", input=ids)
    hf = transformers.AutoModelForCausalLM.from_pretrained(default_model_path, dtype=torch.float32).eval()
    for row, got in zip(ids, reply.data):
        with torch.no_grad():
            last = hf.model(torch.tensor([row])).last_hidden_state[0, -1]
        want = torch.nn.functional.normalize(last, dim=0)
        assert float(torch.dot(torch.tensor(got.embedding), want)) >= 0.9999


def test_token_ids_and_texts_give_the_same_vector(shared_server: RunningServer, default_tokenizer: Any) -> None:
    ids = default_tokenizer.encode(TEXTS[1])
    by_text = _embed(shared_server, {"input": TEXTS[1]})["data"][0]["embedding"]
    by_ids = _embed(shared_server, {"input": ids})["data"][0]["embedding"]
    assert by_ids == pytest.approx(by_text, abs=1e-6)


def test_dimensions_cut_and_normalize_again(client: openai.OpenAI) -> None:
    full = client.embeddings.create(model="m", input=TEXTS[0]).data[0].embedding
    cut = client.embeddings.create(model="m", input=TEXTS[0], dimensions=64).data[0].embedding
    scale = _norm(full[:64])
    assert len(cut) == 64 and cut == pytest.approx([v / scale for v in full[:64]], abs=1e-6)


def test_a_shared_prefix_comes_from_the_radix_cache_and_changes_nothing(shared_server: RunningServer) -> None:
    wait_idle(shared_server)
    assert post(shared_server, "/flush_cache", {}).status_code == 200
    second = PREFIX + "And this one ends differently."
    alone = _embed(shared_server, {"input": second})
    assert alone["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    wait_idle(shared_server)
    assert post(shared_server, "/flush_cache", {}).status_code == 200
    _embed(shared_server, {"input": PREFIX + "This input goes first."})
    cached = _embed(shared_server, {"input": second})
    prefix_tokens = alone["usage"]["prompt_tokens"] - 8
    assert cached["usage"]["prompt_tokens_details"]["cached_tokens"] >= prefix_tokens > 100
    got, want = cached["data"][0]["embedding"], alone["data"][0]["embedding"]
    assert max(abs(a - b) for a, b in zip(got, want)) < 1e-4


def test_inputs_of_one_request_share_their_prefix(shared_server: RunningServer) -> None:
    wait_idle(shared_server)
    assert post(shared_server, "/flush_cache", {}).status_code == 200
    texts = [PREFIX + f"Ending number {i}." for i in range(3)]
    together = _embed(shared_server, {"input": texts})
    prefix_tokens = together["usage"]["prompt_tokens"] // 3 - 8
    assert together["usage"]["prompt_tokens_details"]["cached_tokens"] >= 2 * prefix_tokens
    wait_idle(shared_server)
    assert post(shared_server, "/flush_cache", {}).status_code == 200
    alone = _embed(shared_server, {"input": texts[2]})["data"][0]["embedding"]
    assert max(abs(a - b) for a, b in zip(together["data"][2]["embedding"], alone)) < 1e-4


def test_rerank_in_cohere_and_jina_shape(shared_server: RunningServer) -> None:
    docs: list[Any] = ["Paris is the capital of France.", {"text": "Bananas are yellow."},
                       "The Eiffel tower is in Paris."]
    resp = post(shared_server, "/v1/rerank", {"model": "m", "query": "capital of France", "documents": docs,
                                             "top_n": 2})
    assert resp.status_code == 200, resp.text
    out = resp.json()
    results = out["results"]
    assert len(results) == 2 and results[0]["relevance_score"] >= results[1]["relevance_score"]
    texts = [d if isinstance(d, str) else d["text"] for d in docs]
    assert all(r["document"]["text"] == texts[r["index"]] for r in results)
    assert out["usage"]["total_tokens"] > 0 and out["id"].startswith("rerank-")
    bare = post(shared_server, "/v1/rerank", {"query": "q", "documents": texts, "return_documents": False}).json()
    assert len(bare["results"]) == 3 and all("document" not in r for r in bare["results"])


def test_score_is_the_cosine_of_the_two_embeddings(shared_server: RunningServer) -> None:
    resp = post(shared_server, "/v1/score", {"model": "m", "text_1": TEXTS[0], "text_2": TEXTS[1:]})
    assert resp.status_code == 200, resp.text
    out = resp.json()
    assert out["object"] == "list" and [d["index"] for d in out["data"]] == [0, 1]
    vectors = [d["embedding"] for d in _embed(shared_server, {"input": TEXTS})["data"]]
    for item, other in zip(out["data"], vectors[1:]):
        assert item["object"] == "score"
        assert item["score"] == pytest.approx(sum(a * b for a, b in zip(vectors[0], other)), abs=1e-5)
    pairs = post(shared_server, "/v1/score", {"text_1": TEXTS[:2], "text_2": TEXTS[1:]}).json()
    assert len(pairs["data"]) == 2 and pairs["usage"]["completion_tokens"] == 0


@pytest.mark.parametrize("route,body,param", [
    ("/v1/embeddings", {"input": "hi", "dimensions": 0}, "dimensions"),
    ("/v1/embeddings", {"input": "hi", "dimensions": HIDDEN + 1}, "dimensions"),
    ("/v1/embeddings", {"input": ""}, "input"),
    ("/v1/embeddings", {"input": []}, "input"),
    ("/v1/embeddings", {"input": ["ok", "word " * 2100]}, "input[1]"),
    ("/v1/embeddings", {"input": [[1, 2], [1 << 20]]}, "input[1]"),
    ("/v1/embeddings", {"input": ["a"] * 257}, "input"),  # --max-prompts-per-request 256
    ("/v1/rerank", {"query": "q", "documents": ["a"] * 256}, "documents"),  # with the query: 257 texts
    # Over the texts' bound, the union's other member (one list of ids) reads further: its item 0.
    ("/v1/embeddings", {"input": ["a"] * 2049}, "input[0]"),
    ("/v1/embeddings", {"input": "hi", "encoding_format": "int8"}, "encoding_format"),
    ("/v1/rerank", {"query": "q", "documents": []}, "documents"),
    ("/v1/rerank", {"query": "q", "documents": ["a"] * 1025}, "documents"),
    ("/v1/rerank", {"query": "q", "documents": [{"txt": "a"}]}, "documents[0].text"),
    ("/v1/rerank", {"query": "word " * 2100, "documents": ["a"]}, "query"),
    ("/v1/rerank", {"query": "q", "documents": ["a"], "top_n": 0}, "top_n"),
    ("/v1/score", {"text_1": ["a", "b"], "text_2": ["a", "b", "c"]}, "text_2"),
    ("/v1/score", {"text_1": "a", "text_2": ["a", "word " * 2100]}, "text_2[1]"),
    ("/v1/score", {"text_1": "a"}, "text_2"),
])
def test_bad_bodies_are_a_400_naming_the_field(shared_server: RunningServer, route: str, body: dict[str, Any],
                                               param: str) -> None:
    resp = post(shared_server, route, body)
    assert resp.status_code == 400, resp.text
    assert resp.json()["error"]["param"] == param, resp.text
    assert requests.get(shared_server.url + "/health", timeout=10).status_code == 200
