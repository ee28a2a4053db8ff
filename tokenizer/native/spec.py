"""The native routes' bodies, declared once (validator, errors and /openapi.json).

    text | input_ids          exactly one: str | list[str], or list[int] | list[list[int]]
    sampling_params           object (shared by the batch) | list of objects (one per prompt)
    rid                       str (a batch gets f"{rid}_{i}") | list[str] | None (uuid4 hex)
    return_logprob            bool | list[bool]
    logprob_start_len         int >= -1 | list            (-1: output logprobs only)
    top_logprobs_num          int >= 0 | list
    return_text_in_logprobs   bool
    stream                    bool
    timeout                   seconds > 0                 default --request-timeout (none)
    priority                  int (32-bit)                with --enable-priority-scheduling
    extra_key                 str                         the prefix-cache namespace: requests with
                                                          different keys never share cached KV

Unknown fields of /generate are ignored, as SGLang does (its clients send fields of features this
server lacks with their neutral values).
"""

from __future__ import annotations

from typing import Annotated

from pydantic import ConfigDict, Field

from tokenizer.core.fields import (
    MAX_PROMPTS,
    TOKEN_ID,
    CacheKey,
    Priority,
    PromptIds,
    PromptText,
    SamplingSpec,
    Seconds,
    TopNum,
)
from tokenizer.core.spec import NAME, Length, Spec

# A long context's worth of ids: more than any prompt or output this server can hold, and small
# enough that its validation (on the loop, before the decode leaves it) stays short.
MAX_DETOKENIZE_IDS = 1 << 17
StartLen = Annotated[int, Field(ge=-1, lt=1 << 31)]


class GenerateBody(Spec):
    """POST /generate."""

    model_config = ConfigDict(extra="ignore")

    text: PromptText | Annotated[list[PromptText], Length(1, MAX_PROMPTS)] | None = None
    input_ids: PromptIds | Annotated[list[PromptIds], Length(1, MAX_PROMPTS)] | None = None
    sampling_params: SamplingSpec | Annotated[list[SamplingSpec], Length(1, MAX_PROMPTS)] | None = None
    rid: NAME | Annotated[list[NAME], Length(1, MAX_PROMPTS)] | None = None
    return_logprob: bool | Annotated[list[bool], Length(1, MAX_PROMPTS)] | None = None
    logprob_start_len: StartLen | Annotated[list[StartLen], Length(1, MAX_PROMPTS)] | None = None
    top_logprobs_num: TopNum | Annotated[list[TopNum], Length(1, MAX_PROMPTS)] | None = None
    return_text_in_logprobs: bool | None = None
    stream: bool | None = None
    timeout: Seconds | None = None
    priority: Priority | None = None
    extra_key: CacheKey | None = None


class AbortBody(Spec):
    """POST /abort_request: one rid (its n>1 samples and a batch's prompts go too), or all of
    the caller's requests."""

    rid: NAME | None = None
    abort_all: bool | None = None


class TokenizeBody(Spec):
    """POST /tokenize: {prompt, add_special_tokens}; `model` is accepted and ignored."""

    prompt: PromptText | Annotated[list[PromptText], Length(1, MAX_PROMPTS)]
    add_special_tokens: bool = True
    model: NAME | None = None


class DetokenizeBody(Spec):
    """POST /detokenize."""

    tokens: Annotated[list[TOKEN_ID], Length(0, MAX_DETOKENIZE_IDS)]
    skip_special_tokens: bool = False
    model: NAME | None = None
