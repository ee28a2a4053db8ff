"""The bodies of /v1/embeddings (OpenAI), /v1/rerank (Cohere's and Jina's shape) and /v1/score
(vLLM's), declared once: validator, errors and /openapi.json.

The list bounds are the specs' own; the server's --max-prompts-per-request also caps how many
texts one request embeds (a rerank embeds its query and every document, a score both sides).
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from tokenizer.core.fields import PromptIds, PromptText
from tokenizer.core.spec import NAME, Length, Spec

MAX_INPUTS = 2048  # OpenAI's bound on one embeddings request's inputs
MAX_DOCUMENTS = 1024  # documents of one rerank, texts of one side of a score
MAX_DIMENSIONS = 1 << 16  # beyond any model; the model's own size is checked with its limits
Dimensions = Annotated[int, Field(ge=1, le=MAX_DIMENSIONS)]


class EmbeddingBody(Spec):
    """POST /v1/embeddings: `input` is a text, texts, token ids, or lists of token ids."""

    input: (PromptText | Annotated[list[PromptText], Length(1, MAX_INPUTS)] | PromptIds
            | Annotated[list[PromptIds], Length(1, MAX_INPUTS)])
    model: NAME | None = None
    encoding_format: Literal["float", "base64"] | None = None
    dimensions: Dimensions | None = None
    user: NAME | None = None


class DocumentObject(Spec):
    text: PromptText


Document = PromptText | DocumentObject


class RerankBody(Spec):
    """POST /v1/rerank (and /rerank): Cohere's and Jina's body."""

    query: PromptText
    documents: Annotated[list[Document], Length(1, MAX_DOCUMENTS)]
    model: NAME | None = None
    top_n: Annotated[int, Field(ge=1, le=MAX_DOCUMENTS)] | None = None
    return_documents: bool | None = None
    user: NAME | None = None


Texts = PromptText | Annotated[list[PromptText], Length(1, MAX_DOCUMENTS)]


class ScoreBody(Spec):
    """POST /v1/score (and /score): vLLM's body; `text_1` of one text is paired with each `text_2`."""

    text_1: Texts
    text_2: Texts
    model: NAME | None = None
    user: NAME | None = None
