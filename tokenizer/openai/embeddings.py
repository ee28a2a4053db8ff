"""/v1/embeddings: OpenAI's body into an embedding job, and OpenAI's answer.

    {"object": "list", "data": [{"object": "embedding", "index": i, "embedding": [...] | "<base64>"}],
     "model": ..., "usage": {"prompt_tokens": N, "total_tokens": N, "prompt_tokens_details": {"cached_tokens": C}}}

`encoding_format` "base64" is the vector's little-endian float32 bytes, as OpenAI's client decodes
them (its default). `dimensions` is allowed for every model: it keeps the leading values and
normalizes them again, which is what Matryoshka-trained models expect; on other models the cut
vector is still a unit vector, but a worse one. It must be at most the model's embedding size.
"""

from __future__ import annotations

import base64
import struct
import uuid
from typing import Any

from tokenizer.core.embed import Embedded, EmbedJob
from tokenizer.core.spec import BRACKETS, parse
from tokenizer.openai.embed_spec import EmbeddingBody


def parse_embeddings(raw: Any, owner: str = "") -> tuple[EmbedJob, bool]:
    """(the job, whether to answer base64) from a /v1/embeddings body (InvalidRequest naming the field)."""
    body = parse(EmbeddingBody, raw, BRACKETS)
    inputs = body.input
    if isinstance(inputs, str) or isinstance(inputs[0], int):  # one text, or one list of ids
        texts: list[str | list[int]] = [inputs if isinstance(inputs, str) else list(inputs)]
        fields = ["input"]
    else:
        texts = list(inputs)
        fields = [f"input[{i}]" for i in range(len(texts))]
    job = EmbedJob(texts, fields, "input", rid=f"embd-{uuid.uuid4().hex}", owner=owner, dimensions=body.dimensions)
    return job, body.encoding_format == "base64"


def encode_base64(vector: list[float]) -> str:
    """The vector as little-endian float32 bytes in base64 (numpy's `frombuffer(..., "<f4")` reads it)."""
    return base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode("ascii")


def usage(results: list[Embedded]) -> dict[str, Any]:
    tokens = sum(r.prompt_tokens for r in results)
    return {"prompt_tokens": tokens, "total_tokens": tokens,
            "prompt_tokens_details": {"cached_tokens": sum(r.cached_tokens for r in results)}}


def embeddings_answer(results: list[Embedded], model: str, as_base64: bool) -> dict[str, Any]:
    data = [{"object": "embedding", "index": i, "embedding": encode_base64(r.vector) if as_base64 else r.vector}
            for i, r in enumerate(results)]
    return {"object": "list", "data": data, "model": model, "usage": usage(results)}
