"""What OpenAI's completions and chat routes share: the sampling fields of their bodies, the
names their errors use, usage, the chunk header, and the answers' shared part (`OpenAIAnswer`).

    sampling = sampling_fields(body, max_tokens)      # SamplingParams' names
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from typing import Any

from tokenizer.core.events import Usage
from tokenizer.core.request import GenRequest
from tokenizer.errors import error_body
from tokenizer.openai.spec import Sampling

# OpenAI / SGLang-extra name -> SamplingParams name (the rest keep their names).
SAMPLING_NAMES = {"min_tokens": "min_new_tokens"}
SAMPLING_FIELDS = ("temperature", "top_p", "n", "stop", "seed", "frequency_penalty", "presence_penalty",
                   "logit_bias", "top_k", "min_p", "repetition_penalty", "min_tokens", "ignore_eos",
                   "stop_token_ids", "skip_special_tokens", "no_stop_trim", "spaces_between_special_tokens",
                   "regex", "json_schema", "ebnf")
# The runtime's names of fields as OpenAI's bodies call them, for the errors it raises.
ERROR_NAMES = {"max_new_tokens": "max_tokens", "min_new_tokens": "min_tokens", "sampling_seed": "seed"}


def sampling_fields(body: Sampling, max_tokens: int | None) -> dict[str, Any]:
    """The body's sampling fields by SamplingParams' names (None: not given)."""
    out = {SAMPLING_NAMES.get(name, name): getattr(body, name) for name in SAMPLING_FIELDS
           if getattr(body, name) is not None}
    if max_tokens is not None:
        out["max_new_tokens"] = max_tokens
    return out


def cache_namespace(body: Sampling) -> str | None:
    """The prefix-cache namespace: vLLM's `cache_salt` or SGLang's `extra_key`; both given,
    joined by a NUL so that ("a", "bc") and ("ab", "c") stay apart."""
    given = [key for key in (body.cache_salt, body.extra_key) if key is not None]
    return "\x00".join(given) if given else None


def include_usage(body: Sampling) -> bool:
    return bool(body.stream_options is not None and body.stream_options.include_usage)


def new_rid(body: Sampling) -> str:
    return body.rid or uuid.uuid4().hex


@dataclass(frozen=True, slots=True)
class Header:
    """The id, creation time and model every object and chunk of one answer carries."""

    id: str
    model: str
    created: int

    @classmethod
    def new(cls, prefix: str, rid: str, model: str) -> Header:
        return cls(prefix + rid, model, int(time.time()))

    def of(self, obj: str) -> dict[str, Any]:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model}


def usage(usages: list[Usage], n: int) -> dict[str, Any]:
    """Prompt and cached tokens count once per prompt (the first of its n samples)."""
    firsts = usages[::n]
    prompt = sum(u.prompt_tokens for u in firsts)
    completion = sum(u.completion_tokens for u in usages)
    cached = sum(u.cached_tokens for u in firsts)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": cached}}


class OpenAIAnswer:
    """What the completions and chat answers share: their header, the usage (streamed after the
    last chunk when asked for), and an error after the stream started as an error object.
    `choices` (set by the subclass) hold each choice's latest `usage`."""

    named, done = False, b"data: [DONE]\n\n"
    chunk_object = ""  # the object name of a streamed chunk

    def __init__(self, header: Header, req: GenRequest, include_usage: bool) -> None:
        self.header, self.stream, self.n, self.include_usage = header, req.stream, req.n, include_usage
        self.choices: list[Any] = []

    def usage(self) -> dict[str, Any]:
        return usage([c.usage or Usage(0, 0, 0) for c in self.choices], self.n)

    def end(self) -> list[Any]:
        if not self.include_usage:
            return []
        return [{**self.header.of(self.chunk_object), "choices": [], "usage": self.usage()}]

    def error_events(self, status: int, message: str, param: str | None) -> list[Any]:
        return [error_body(status, message, param)]
