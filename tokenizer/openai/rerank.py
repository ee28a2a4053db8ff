"""/v1/rerank (Cohere's and Jina's shape) and /v1/score (vLLM's) on an embedding model.

With no cross-encoder head, a pair's score is the cosine similarity of the two texts'
embeddings (each embedded as the model's pooling says), in [-1, 1]. A rerank embeds the query
and every document in one job (a decoder's radix cache shares what they have in common) and
answers the documents by falling score, the first `top_n` of them:

    rerank: {"id", "model", "results": [{"index", "relevance_score", "document": {"text"}}],
             "usage": {"total_tokens"}, "meta": {"billed_units": {"search_units": 1}, ...}}
    score:  {"id", "object": "list", "created", "model", "data": [{"index", "object": "score", "score"}],
             "usage": {"prompt_tokens", "total_tokens", "completion_tokens": 0}}

`return_documents` defaults to true (Jina's and vLLM's default). A score pairs a single `text_1`
with every `text_2`, and two lists item by item (then they must be equally long).
"""

from __future__ import annotations

import time
import uuid
from typing import Any

from runtime.contracts.errors import InvalidRequest
from runtime.contracts.pooling import cosine
from tokenizer.core.embed import Embedded, EmbedJob
from tokenizer.core.spec import BRACKETS, parse
from tokenizer.openai.embed_spec import DocumentObject, RerankBody, ScoreBody


def parse_rerank(raw: Any, owner: str = "") -> tuple[RerankBody, EmbedJob]:
    """The body and its job: the query's text first, then each document's."""
    body = parse(RerankBody, raw, BRACKETS)
    texts: list[str | list[int]] = [body.query, *(d.text if isinstance(d, DocumentObject) else d
                                                  for d in body.documents)]
    fields = ["query", *(f"documents[{i}]" for i in range(len(body.documents)))]
    return body, EmbedJob(texts, fields, "documents", rid=f"rerank-{uuid.uuid4().hex}", owner=owner)


def rerank_answer(body: RerankBody, results: list[Embedded], model: str, rid: str) -> dict[str, Any]:
    query, docs = results[0], results[1:]
    scored = sorted(((cosine(query.vector, d.vector), i) for i, d in enumerate(docs)), key=lambda p: (-p[0], p[1]))
    keep = scored[: body.top_n] if body.top_n is not None else scored
    show = body.return_documents is not False
    out = []
    for score, i in keep:
        doc = body.documents[i]
        item: dict[str, Any] = {"index": i, "relevance_score": score}
        if show:
            item["document"] = {"text": doc.text if isinstance(doc, DocumentObject) else doc}
        out.append(item)
    tokens = sum(r.prompt_tokens for r in results)
    return {"id": rid, "model": model, "results": out, "usage": {"total_tokens": tokens, "prompt_tokens": tokens},
            "meta": {"api_version": {"version": "2"}, "billed_units": {"search_units": 1, "input_tokens": tokens}}}


def parse_score(raw: Any, owner: str = "") -> tuple[int, EmbedJob]:
    """(how many pairs, the job): text_1's texts first, then text_2's."""
    body = parse(ScoreBody, raw, BRACKETS)
    left = [body.text_1] if isinstance(body.text_1, str) else list(body.text_1)
    right = [body.text_2] if isinstance(body.text_2, str) else list(body.text_2)
    if len(left) != 1 and len(left) != len(right):
        raise InvalidRequest.field("text_2", f"holds {len(right)} texts but text_1 holds {len(left)}: give one "
                                             "text_1, or as many as text_2")
    texts: list[str | list[int]] = [*left, *right]
    fields = [*_names("text_1", body.text_1, len(left)), *_names("text_2", body.text_2, len(right))]
    return len(right), EmbedJob(texts, fields, "text_2", rid=f"score-{uuid.uuid4().hex}", owner=owner)


def _names(name: str, given: str | list[str], count: int) -> list[str]:
    return [name] if isinstance(given, str) else [f"{name}[{i}]" for i in range(count)]


def score_answer(pairs: int, results: list[Embedded], model: str, rid: str) -> dict[str, Any]:
    left, right = results[: len(results) - pairs], results[len(results) - pairs :]
    data = [{"index": i, "object": "score", "score": cosine(left[0 if len(left) == 1 else i].vector, r.vector)}
            for i, r in enumerate(right)]
    tokens = sum(r.prompt_tokens for r in results)
    return {"id": rid, "object": "list", "created": int(time.time()), "model": model, "data": data,
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens, "completion_tokens": 0}}
