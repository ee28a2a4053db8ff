"""Every message that crosses a process boundary, grouped by destination.

Topology (docs/architecture.md, "The processes"): main process -> scheduler -> detokenizer -> main process, plus the
scheduler's control replies straight to the main process. Each message is a small
`@dataclass(slots=True)` registered with `@message`, so `runtime.contracts.codec` can encode it as a type tag
plus its fields. Use lists, not tuples, in fields: the wire form is JSON, so a tuple comes back as
a list and the decoded message would not compare equal.

Batched output messages (`BatchTokenOut`, `BatchStrOut`) hold *parallel lists*: index `i` of every
list describes request `rids[i]`. Per-request logprob fields are None for a request that did not
ask for logprobs (`return_logprob=False`); the lists are always parallel, even when no request
in the batch asked (then they are all None). Shapes, per request `i`:

    output_logprobs[i]        list[float]              one per id in new_ids[i] / output_ids[i]
    output_top_logprobs[i]    list[TopLogprobs]        one per id in new_ids[i] / output_ids[i]
    input_logprobs[i]         list[float | None]       one per id in input_ids_for_logprobs[i];
                                                       None for the first reported position (SGLang's format)
    input_top_logprobs[i]     list[TopLogprobs | None] aligned with input_logprobs[i]
    input_ids_for_logprobs[i] list[int]                the prompt ids whose logprobs are reported:
                                                       prompt[logprob_start_len:] (-1 means the last prompt token only)

    TopLogprobs = [[token ids...], [logprobs...]]      two lists of top_logprobs_num entries

The input fields are non-None only in the first message for a rid (when its prefill completes);
the output fields are deltas aligned with that message's new ids. A non-finite float (e.g. -inf)
travels as JSON null and decodes as None (orjson writes NaN/inf as null).

Finish reasons are SGLang's JSON shapes: `{"type": "stop", "matched": <token id or string>}`,
`{"type": "length", "length": N}`, `{"type": "abort", "message": str}`; None while unfinished.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, TypeAlias, TypeVar

from runtime.contracts.sampling import SamplingParams

CHILD_SUFFIX = re.compile(r"(?:\d+_)*(?:\d+|warmup)")

TopLogprobs: TypeAlias = list[list[int] | list[float]]
"""One position's top-k: `[[token ids...], [logprobs...]]`, both of length top_logprobs_num."""

MESSAGE_TYPES: dict[str, type] = {}
"""Every registered message class by its wire tag (the class name)."""

_T = TypeVar("_T", bound=type)


def message(cls: _T) -> _T:
    """Class decorator: register a dataclass as a message; its tag is the class name."""
    name = cls.__name__
    assert name not in MESSAGE_TYPES, f"duplicate message tag {name!r}"
    assert hasattr(cls, "__dataclass_fields__"), f"{name} must be a dataclass"
    MESSAGE_TYPES[name] = cls
    return cls


# ---------------------------------------------------------------- to the scheduler


@message
@dataclass(slots=True)
class GenerateReq:
    """A tokenized generation request (main process -> scheduler).

    `logprob_start_len` is the first prompt position whose input logprob is reported; -1 means
    output logprobs only. `extra_key` namespaces the prefix cache (requests with different keys
    never share cached KV). `prefill_only_cache` asks the scheduler to only prefill the prompt
    into the prefix cache (warm-up) and generate nothing. `embed` (with max_new_tokens 0) asks
    for the prompt's pooled hidden state instead of tokens: `BatchTokenOut.embeddings`.
    """

    rid: str
    input_ids: list[int]
    sampling_params: SamplingParams
    return_logprob: bool = False
    logprob_start_len: int = -1
    top_logprobs_num: int = 0
    stream: bool = False
    extra_key: str | None = None
    prefill_only_cache: bool = False
    deadline: float | None = None  # wall-clock seconds (time.time()) after which it is aborted
    priority: int = 0  # with --enable-priority-scheduling: larger is more urgent (see scheduler/priority.py)
    # Pin the prompt's first `pin_prefix_len` tokens in the prefix cache for `pin_ttl_s` seconds once the
    # request has computed them (Anthropic cache_control breakpoints); 0: no pin.
    pin_prefix_len: int = 0
    pin_ttl_s: float = 0.0
    embed: bool = False


@message
@dataclass(slots=True)
class AbortReq:
    """Abort requests (main process -> scheduler).

    NOTE: aborting `rid` also aborts its own fan-out: a request matches when its rid equals `rid`,
    or is `rid` + "_" + a suffix of digit groups or the n>1 warm-up's `warmup` (`rid_0`,
    `rid_2_1`, `rid_warmup`), so a client's `foo` never aborts another's `foo_bar`. An empty
    `rid` matches nothing unless `abort_all`.
    """

    rid: str = ""
    abort_all: bool = False

    def matches(self, rid: str) -> bool:
        if self.abort_all:
            return True
        if not self.rid:
            return False
        if rid == self.rid:
            return True
        # Its own fan-out only: batch items and n>1 samples (rid_3, rid_3_1) and the n>1
        # warm-up copy (rid_warmup), never another client's rid that merely starts the same.
        return rid.startswith(self.rid + "_") and CHILD_SUFFIX.fullmatch(rid[len(self.rid) + 1 :]) is not None


@message
@dataclass(slots=True)
class FlushCacheReq:
    """Drop the whole prefix cache (main process -> scheduler); answered by `FlushCacheOut`."""

    req_id: int


@message
@dataclass(slots=True)
class GetStateReq:
    """Ask the scheduler for its internal state (main process -> scheduler); answered by
    `StateOut`."""

    req_id: int


@message
@dataclass(slots=True)
class ShutdownReq:
    """Stop the receiving process's loop and exit cleanly (launcher -> any child)."""


# ---------------------------------------------------------------- scheduler -> detokenizer


@message
@dataclass(slots=True)
class BatchTokenOut:
    """New output token ids of every request that has output in one forward step.

    One message per step, never one per request. See the module docstring for the logprob shapes.

    Fields (parallel lists, index i = request rids[i]):
        finished_reasons: SGLang JSON shape, or None while unfinished.
        new_ids: output token ids produced since this rid's previous message (may be empty
            when a request only finishes, e.g. aborted while waiting).
        decode_prefix: on a rid's first message, up to 5 last prompt ids that the detokenizer
            decodes as surrounding context (SGLang's surr_offset); None on later messages.
        prompt_tokens / completion_tokens / cached_tokens: running totals, not deltas.
        skip_special_tokens / spaces_between_special_tokens: the request's decode flags.
        stop_strs: the request's stop strings in its first message, [] after (the detokenizer keeps them).
        no_stop_trim: keep the matched stop string / stop token in the output text.
        matched_stop_token: the request finished on a stop token (EOS or stop_token_ids) and that
            token is the last id of new_ids; unless no_stop_trim, it is not decoded into text.
    """

    rids: list[str]
    finished_reasons: list[dict[str, Any] | None]
    new_ids: list[list[int]]
    decode_prefix: list[list[int] | None]
    prompt_tokens: list[int]
    completion_tokens: list[int]
    cached_tokens: list[int]
    skip_special_tokens: list[bool]
    spaces_between_special_tokens: list[bool]
    stop_strs: list[list[str]]
    no_stop_trim: list[bool]
    matched_stop_token: list[bool]
    output_logprobs: list[list[float] | None]
    output_top_logprobs: list[list[TopLogprobs] | None]
    input_logprobs: list[list[float | None] | None]
    input_top_logprobs: list[list[TopLogprobs | None] | None]
    input_ids_for_logprobs: list[list[int] | None]
    # Seconds the request waited in the scheduler before its first forward, on its first
    # message (None after, and for requests that never ran).
    queue_times: list[float | None] = field(default_factory=list)
    # Prompt tokens this request's pin writes into the prefix cache (not cached before it), from its
    # admission on; 0 without a pin or when the pin was refused: Anthropic's cache_creation_input_tokens.
    pinned_tokens: list[int] = field(default_factory=list)
    # An embed request's pooled vector (fp32 values, not normalized) on its finishing message; None
    # otherwise. `runtime.contracts.pooling` says how the main process finishes it.
    embeddings: list[list[float] | None] = field(default_factory=list)


# ---------------------------------------------------------------- detokenizer -> main process


FAILED_KEY = "detokenizer_failed"
"""In a BatchStrOut finish_reason: the detokenizer failed this request (its output could not be
decoded) while the scheduler may still be running it; the main process aborts it there."""


@message
@dataclass(slots=True)
class BatchStrOut:
    """Decoded text deltas of one `BatchTokenOut` (detokenizer -> main process).

    Fields (parallel lists, index i = request rids[i]):
        texts: new text since this rid's previous message. It may be "" while output_ids is not
            (an incomplete UTF-8 sequence, or text held back as a possible stop-string prefix);
            on a finished request it ends trimmed at the stop string unless no_stop_trim.
        output_ids: the same id deltas as `BatchTokenOut.new_ids` (stop token included).
        prompt_tokens / completion_tokens / cached_tokens: running totals.
        Logprob fields: passed through unchanged from `BatchTokenOut`.
    """

    rids: list[str]
    finished_reasons: list[dict[str, Any] | None]
    texts: list[str]
    output_ids: list[list[int]]
    prompt_tokens: list[int]
    completion_tokens: list[int]
    cached_tokens: list[int]
    output_logprobs: list[list[float] | None]
    output_top_logprobs: list[list[TopLogprobs] | None]
    input_logprobs: list[list[float | None] | None]
    input_top_logprobs: list[list[TopLogprobs | None] | None]
    input_ids_for_logprobs: list[list[int] | None]
    queue_times: list[float | None] = field(default_factory=list)  # passed through unchanged
    decode_states: int = 0  # the detokenizer's live decode states after this batch (leak checks)
    pinned_tokens: list[int] = field(default_factory=list)  # passed through unchanged ([] from old senders)
    embeddings: list[list[float] | None] = field(default_factory=list)  # passed through unchanged


# ---------------------------------------------------------------- control replies -> main process


@message
@dataclass(slots=True)
class FlushCacheOut:
    """Reply to `FlushCacheReq` with the same `req_id` (scheduler -> main process)."""

    req_id: int
    success: bool
    message: str = ""


@message
@dataclass(slots=True)
class StateOut:
    """Reply to `GetStateReq` with the same `req_id`; `state` is a JSON object (string keys)."""

    req_id: int
    state: dict[str, Any]


@message
@dataclass(slots=True)
class SchedulerCrashed:
    """A child process died of an uncaught exception (any child -> main process).

    `process` names the child ("scheduler", "detokenizer"); `traceback` is the formatted text.
    """

    process: str
    traceback: str


@message
@dataclass(slots=True)
class ChildReady:
    """Launch handshake: a child finished initialising (child -> launcher, over its ready pipe).

    `info` is a JSON object, e.g. the scheduler's resolved KV capacity and max running requests.
    """

    process: str
    info: dict[str, Any]


# ---------------------------------------------------------------- between tensor-parallel ranks
# Rank 0 -> ranks 1.. over the group's private channel (runtime/parallel/group.py, runtime/execution/tp_worker.py).


@message
@dataclass(slots=True)
class TPSharedMemory:
    """The path of the group's shared-memory mapping, which rank 0 has just created."""

    path: str


@message
@dataclass(slots=True)
class TPStep:
    """Run this forward. `entries` are ForwardEntry wire lists (`runtime.execution.tp_worker.entry_to_wire`)."""

    entries: list[list[Any]]
    keep_logits: bool


@message
@dataclass(slots=True)
class TPStop:
    """Rank 0's scheduler stopped: leave the group and exit."""
