"""Embeddings through the same manager as generations: each input is a prompt with
max_new_tokens 0 and `embed` set, so the scheduler prefills it like any prompt (a decoder's
shared prefixes come from the radix cache) and answers its pooled hidden state, which is finished
here (normalized, cut to `dimensions`) by the model's pooling (`runtime.contracts.pooling`).

    vectors = await embed_inputs(tm, EmbedJob(inputs, ["input[0]", ...], "input", rid="emb-1"))
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from runtime.contracts.errors import InvalidRequest
from runtime.contracts.pooling import Pooling, finish_embedding
from tokenizer.core.request import GenRequest, PromptRequest
from tokenizer.limits import check_prompt_count

if TYPE_CHECKING:
    from tokenizer.manager import TokenizerManager

EMBED_SAMPLING = {"max_new_tokens": 0}


@dataclass(frozen=True, slots=True)
class EmbedJob:
    """Inputs to embed (texts or token ids), the body field each came from (for errors: `input`,
    `input[2]`, `documents[0]`), the field that too many inputs is blamed on, and who asks."""

    inputs: list[str | list[int]]
    fields: list[str]
    count_field: str
    rid: str
    owner: str = ""
    dimensions: int | None = None
    cache_namespace: str | None = None
    names: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Embedded:
    vector: list[float]
    prompt_tokens: int
    cached_tokens: int


def pooling_of(tm: TokenizerManager) -> Pooling:
    """The served model's pooling, from the scheduler's ready info."""
    info = tm.scheduler_info.get("pooling") or {}
    return Pooling(info.get("mode", "last"), bool(info.get("normalize", True)))


def check_dimensions(dimensions: int | None, hidden: int, name: str = "dimensions") -> None:
    """`dimensions` must be positive and at most the model's hidden size."""
    if dimensions is not None and not 0 < dimensions <= hidden:
        raise InvalidRequest.field(name, f"must be between 1 and the model's embedding size {hidden}, got {dimensions}")


async def embed_inputs(tm: TokenizerManager, job: EmbedJob) -> list[Embedded]:
    """One finished vector per input, in input order (InvalidRequest naming the field, or
    RuntimeCrashed, raise before anything is sent when the inputs are wrong)."""
    pooling = pooling_of(tm)
    check_dimensions(job.dimensions, int(tm.scheduler_info.get("hidden_size") or 0))
    check_prompt_count(len(job.inputs), tm.config.max_prompts_per_request, job.count_field)
    prompts = [PromptRequest(p, f"{job.rid}_{i}", EMBED_SAMPLING, field=f)
               for i, (p, f) in enumerate(zip(job.inputs, job.fields, strict=True))]
    req = GenRequest(prompts, batch=True, group_rid=job.rid, owner=job.owner, names=job.names,
                     cache_namespace=job.cache_namespace, embed=True)
    taken = await tm.submit(req)
    out: list[Embedded | None] = [None] * len(prompts)
    async with contextlib.aclosing(taken):  # type: ignore[type-var]
        async for i, delta in taken:
            reason = delta.finish_reason or {}
            if delta.embedding is None:  # aborted (its deadline passed): the HTTP layer's 504
                raise TimeoutError(f"{job.fields[i]} was not embedded: {reason.get('message', 'aborted')}")
            vector = finish_embedding(delta.embedding, pooling, job.dimensions)
            out[i] = Embedded(vector, delta.prompt_tokens, delta.cached_tokens)
    assert all(e is not None for e in out), "every input finishes once"
    return [e for e in out if e is not None]
