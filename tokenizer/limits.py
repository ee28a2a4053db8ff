"""Everything a generation request must satisfy before it is sent to the scheduler.

Each failure is an `InvalidRequest` naming the field, so the HTTP layer answers 400 and nothing
reaches the scheduler: sampling values, token ids inside the vocabulary, the context length, the
KV pool, the server's caps on `n` and `top_logprobs_num`, and (asynchronously, built in a guarded
worker process, see `runtime.support.grammar_check`) the grammar.
"""

from __future__ import annotations

from dataclasses import dataclass

from runtime.contracts.errors import InvalidRequest
from runtime.contracts.sampling import SamplingParams
from runtime.support.grammar_check import grammar_spec, validate_grammar_async
from tokenizer.generate_body import SingleRequest


@dataclass(frozen=True)
class RequestLimits:
    vocab_size: int
    context_length: int
    kv_total: int | None  # the whole KV pool, from the scheduler's ready info
    max_n: int
    max_top_logprobs: int


def check_request(single: SingleRequest, ids: list[int], params: SamplingParams, lim: RequestLimits) -> None:
    """Raise `InvalidRequest` (naming the field) for anything the runtime must not be sent;
    the grammar is checked separately, off the event loop (`check_grammar`)."""
    params.validate(lim.vocab_size)
    _check_lengths(single.prompt_field, ids, params.max_new_tokens, lim)
    if params.n > lim.max_n:
        raise InvalidRequest(f"n must be <= {lim.max_n}, got {params.n}", param="n")
    if single.top_logprobs_num > lim.max_top_logprobs:
        raise InvalidRequest(f"top_logprobs_num must be <= {lim.max_top_logprobs}",
                             param="top_logprobs_num")
    if single.logprob_start_len >= len(ids):
        raise InvalidRequest(f"logprob_start_len must be < the prompt length {len(ids)}",
                             param="logprob_start_len")


async def check_grammar(params: SamplingParams) -> None:
    """Raise `InvalidRequest` naming `json_schema` / `regex` / `ebnf` if the grammar is invalid,
    too big, or too slow to build (the check runs in a worker process with a timeout)."""
    spec = grammar_spec(params)
    if spec is not None:
        await validate_grammar_async(spec)


def check_prompt_count(count: int, limit: int, field: str) -> None:
    """At most `limit` prompts (--max-prompts-per-request) in one request."""
    if count > limit:
        raise InvalidRequest(f"{count} prompts in one request; at most {limit} (--max-prompts-per-request)",
                             param=field)


def check_prompt_ids(field: str, ids: list[int], vocab_size: int, context_length: int) -> None:
    """A prompt's ids (known non-negative): some, in the vocabulary, within the context."""
    if not ids:
        raise InvalidRequest(f"{field} encodes to no tokens", param=field)
    if max(ids) >= vocab_size:
        raise InvalidRequest(f"{field}: token id {max(ids)} is outside [0, {vocab_size})", param=field)
    if len(ids) > context_length:
        raise InvalidRequest(f"The input ({len(ids)} tokens) is longer than the model's "
                             f"context length ({context_length} tokens).", param=field)


def _check_lengths(field: str, ids: list[int], max_new: int, lim: RequestLimits) -> None:
    limit = lim.context_length
    check_prompt_ids(field, ids, lim.vocab_size, limit)
    if len(ids) + max_new > limit:
        raise InvalidRequest(
            f"Requested token count exceeds the model's maximum context length of {limit} "
            f"tokens. You requested a total of {len(ids) + max_new} tokens: "
            f"{len(ids)} tokens from the input and {max_new} tokens for the "
            "completion (max_new_tokens). Reduce the input or max_new_tokens.",
            param="max_new_tokens")
    if lim.kv_total is not None and len(ids) + max_new > lim.kv_total:
        raise InvalidRequest(
            f"The request needs {len(ids) + max_new} KV cache slots ({len(ids)} input + "
            f"{max_new} max_new_tokens) but the whole KV cache holds {lim.kv_total}. "
            "Reduce the input or max_new_tokens.",
            param="max_new_tokens")
