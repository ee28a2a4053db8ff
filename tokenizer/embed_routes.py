"""/v1/embeddings, /v1/rerank and /v1/score: each body parsed by its protocol module
(`openai/embeddings.py`, `openai/rerank.py`), embedded by the core (`core/embed.py`), answered
as JSON. Each counts as a generation in flight while it runs, so a drain waits for it.
"""

from __future__ import annotations

from typing import Any

from tokenizer.core.embed import Embedded, EmbedJob, embed_inputs
from tokenizer.openai.embeddings import embeddings_answer, parse_embeddings
from tokenizer.openai.rerank import parse_rerank, parse_score, rerank_answer, score_answer
from tokenizer.server_state import ServerState


async def embeddings(server: ServerState, body: Any, owner: str) -> dict[str, Any]:
    job, as_base64 = parse_embeddings(body, owner)
    return embeddings_answer(await _embed(server, job), server.model_name, as_base64)


async def rerank(server: ServerState, body: Any, owner: str) -> dict[str, Any]:
    parsed, job = parse_rerank(body, owner)
    return rerank_answer(parsed, await _embed(server, job), server.model_name, job.rid)


async def score(server: ServerState, body: Any, owner: str) -> dict[str, Any]:
    pairs, job = parse_score(body, owner)
    return score_answer(pairs, await _embed(server, job), server.model_name, job.rid)


async def _embed(server: ServerState, job: EmbedJob) -> list[Embedded]:
    tm = server.accepting_manager()
    with server.track():
        return await embed_inputs(tm, job)
