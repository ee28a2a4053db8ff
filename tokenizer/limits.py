"""Everything a generation request must satisfy before it is sent to the scheduler: the one
place that decides whether it fits the context and the KV pool (the scheduler trusts it).

Each failure is an `InvalidRequest` naming the field, so the HTTP layer answers 400 and nothing
reaches the scheduler: sampling values, token ids inside the vocabulary, the context length, the
KV pool, the server's caps on `n` and `top_logprobs_num`, and (asynchronously, built in a guarded
worker process, see `runtime.support.grammar_check`) the grammar. A text prompt whose length in
characters alone proves it cannot fit is refused before it is tokenized (`check_prompt_chars`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from runtime.contracts.errors import InvalidRequest
from runtime.contracts.sampling import SamplingParams
from runtime.support.grammar_check import grammar_spec, validate_grammar_async
from tokenizer.core.request import Logprobs


@dataclass(frozen=True)
class RequestLimits:
    vocab_size: int
    context_length: int
    kv_total: int | None  # the whole KV pool, from the scheduler's ready info
    max_n: int
    max_top_logprobs: int
    max_chars_per_token: int | None = None  # None: the tokenizer may shrink text; no char bound

    @property
    def budget(self) -> int:
        """Prompt + output tokens one request may use (never past the KV pool)."""
        return self.context_length if self.kv_total is None else min(self.context_length, self.kv_total)


def check_prompt_chars(field: str, chars: int, lim: RequestLimits) -> None:
    """Refuse, before tokenizing, a text whose every token holds at most `max_chars_per_token`
    characters yet which is longer than the context's worth of them."""
    if lim.max_chars_per_token is None:
        return
    most = lim.context_length * lim.max_chars_per_token
    if chars > most:
        raise InvalidRequest.field(field, f"the prompt has {chars} characters: more than {lim.context_length} "
                                          f"tokens of at most {lim.max_chars_per_token} characters each, the "
                                          "model's context length")


def max_new_tokens(params: SamplingParams, given: bool, ids: list[int], lim: RequestLimits) -> int:
    """The request's max_new_tokens: as given, or (`given` False) what the budget leaves."""
    return params.max_new_tokens if given else max(lim.budget - len(ids), 0)


def check_request(field: str, ids: list[int], params: SamplingParams, logprobs: Logprobs,
                  lim: RequestLimits) -> None:
    """Raise `InvalidRequest` (naming the field) for anything the runtime must not be sent;
    the grammar is checked separately, off the event loop (`check_grammar`)."""
    params.validate(lim.vocab_size)
    _check_lengths(field, ids, params.max_new_tokens, lim)
    if params.n > lim.max_n:
        raise InvalidRequest.field("n", f"must be <= {lim.max_n}, got {params.n}")
    if logprobs.top_n > lim.max_top_logprobs:
        raise InvalidRequest.field("top_logprobs_num", f"must be <= {lim.max_top_logprobs}")
    if logprobs.start_len >= len(ids):
        raise InvalidRequest.field("logprob_start_len", f"must be < the prompt length {len(ids)}")


async def check_grammar(params: SamplingParams) -> None:
    """Raise `InvalidRequest` naming `json_schema` / `regex` / `ebnf` if the grammar is invalid,
    too big, or too slow to build (the check runs in a worker process with a timeout)."""
    spec = grammar_spec(params)
    if spec is not None:
        await validate_grammar_async(spec)


def check_task(embed: bool, info: dict[str, Any]) -> None:
    """What the served model can do, from the scheduler's ready info: an encoder only embeds,
    and a decoder embeds by its last token only (a cached prefix keeps no hidden states)."""
    pooling = (info.get("pooling") or {}).get("mode", "last")
    if info.get("encoder") and not embed:
        raise InvalidRequest.field("model", "this model is an encoder: it serves /v1/embeddings, /v1/rerank and "
                                            "/v1/score, not generation")
    if embed and not info.get("encoder") and pooling != "last":
        raise InvalidRequest.field("model", f"this decoder's pooling {pooling!r} is not served: decoders embed "
                                            "by their last token only")


def check_prompt_count(count: int, limit: int, field: str) -> None:
    """At most `limit` prompts (--max-prompts-per-request) in one request."""
    if count > limit:
        raise InvalidRequest.field(field, f"{count} prompts in one request; at most {limit} "
                                          "(--max-prompts-per-request)")


def check_prompt_ids(field: str, ids: list[int], vocab_size: int, context_length: int) -> None:
    """A prompt's ids: some, in the vocabulary, within the context."""
    if not ids:
        raise InvalidRequest.field(field, "encodes to no tokens")
    if min(ids) < 0 or max(ids) >= vocab_size:
        bad = min(ids) if min(ids) < 0 else max(ids)
        raise InvalidRequest.field(field, f"token id {bad} is outside [0, {vocab_size})")
    if len(ids) > context_length:
        raise InvalidRequest.field(field, f"The input ({len(ids)} tokens) is longer than the model's "
                                          f"context length ({context_length} tokens).")


def _check_lengths(field: str, ids: list[int], max_new: int, lim: RequestLimits) -> None:
    limit = lim.context_length
    check_prompt_ids(field, ids, lim.vocab_size, limit)
    if len(ids) + max_new > limit:
        raise InvalidRequest.field(
            "max_new_tokens",
            f"Requested token count exceeds the model's maximum context length of {limit} tokens. You "
            f"requested a total of {len(ids) + max_new} tokens: {len(ids)} tokens from the input and "
            f"{max_new} tokens for the completion. Reduce the input or the completion's length.")
    if lim.kv_total is not None and len(ids) + max_new > lim.kv_total:
        raise InvalidRequest.field(
            "max_new_tokens",
            f"The request needs {len(ids) + max_new} KV cache slots ({len(ids)} input + {max_new} "
            f"for the completion) but the whole KV cache holds {lim.kv_total}. Reduce the input or "
            "the completion's length.")
