"""SGLang's native `/generate` body: normalization into single requests, and logprob shapes.

`normalize_generate(body)` checks structure and types only (no tokenizer, no model limits) and
splits a batch into `SingleRequest`s. Accepted fields (a JSON null means "the default"):

    text | input_ids          exactly one: str | list[str], or list[int] | list[list[int]]
    sampling_params           dict (shared by the batch) | list[dict] (one per prompt) | None
    rid                       str (a batch gets f"{rid}_{i}") | list[str] | None (uuid4 hex)
    return_logprob            bool | list[bool]            default False
    logprob_start_len         int | list[int]  (>= -1)     default -1 (output logprobs only)
    top_logprobs_num          int | list[int]  (>= 0)      default 0
    return_text_in_logprobs   bool                         default False
    stream                    bool                         default False
    timeout                   number > 0 (seconds)         default --request-timeout (none)

Unknown keys are ignored, as SGLang does. Every rejection is an `InvalidRequest` naming the field.
The response helpers turn the wire logprob shapes (runtime/messages.py) into SGLang's
`[[logprob, token_id, text_or_None], ...]` lists, and `ReqState` is the main process's record
of one request, folded from BatchStrOut entries into SGLang's result dict by `build_output`.
No sockets here: the TokenizerManager owns those.
"""

from __future__ import annotations

import asyncio
import math
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from runtime.errors import InvalidRequest
from runtime.messages import BatchStrOut, GenerateReq

TopLogprobsWire = Sequence[Sequence[Any]]  # [[token ids...], [logprobs...]]
LogprobEntry = list[Any]  # [logprob | None, token_id, text | None]


@dataclass(slots=True)
class SingleRequest:
    """One prompt of a /generate call, before tokenization (exactly one of text / input_ids)."""

    rid: str
    text: str | None = None
    input_ids: list[int] | None = None
    sampling_params: dict[str, Any] = field(default_factory=dict)
    return_logprob: bool = False
    logprob_start_len: int = -1
    top_logprobs_num: int = 0
    return_text_in_logprobs: bool = False
    stream: bool = False
    timeout: float | None = None  # seconds from arrival; past it the request is aborted

    @property
    def prompt_field(self) -> str:
        """The body field the prompt came from, for error messages."""
        return "text" if self.text is not None else "input_ids"


class NormalizedGenerate(NamedTuple):
    """`requests` in body order; `is_batch` is True when the body gave a list of prompts."""

    requests: list[SingleRequest]
    is_batch: bool


def normalize_generate(body: Any) -> NormalizedGenerate:
    """Validate the structure of a /generate body and split it into single requests.

    Raises:
        InvalidRequest: naming the offending field.
    """
    if not isinstance(body, dict):
        raise InvalidRequest("the request body must be a JSON object")
    prompts, field_name, is_batch = _prompts(body)
    n = len(prompts)
    rids = _rids(body.get("rid"), n, is_batch)
    params = _sampling_params(body.get("sampling_params"), n)
    return_logprob = _per_item(body, "return_logprob", n, False, _is_bool, "a boolean")
    start_len = _per_item(body, "logprob_start_len", n, -1, _int_at_least(-1), "an integer >= -1")
    top_num = _per_item(body, "top_logprobs_num", n, 0, _int_at_least(0), "an integer >= 0")
    text_in_lp = _scalar(body, "return_text_in_logprobs", False)
    stream = _scalar(body, "stream", False)
    timeout = _timeout(body.get("timeout"))
    requests = [
        SingleRequest(
            rid=rids[i],
            text=prompts[i] if field_name == "text" else None,
            input_ids=prompts[i] if field_name == "input_ids" else None,
            sampling_params=params[i],
            return_logprob=return_logprob[i],
            logprob_start_len=start_len[i],
            top_logprobs_num=top_num[i],
            return_text_in_logprobs=text_in_lp,
            stream=stream,
            timeout=timeout,
        )
        for i in range(n)
    ]
    return NormalizedGenerate(requests, is_batch)


def _prompts(body: dict[str, Any]) -> tuple[list[Any], str, bool]:
    """(prompts, the field they came from, is_batch)."""
    text, ids = body.get("text"), body.get("input_ids")
    if (text is None) == (ids is None):
        raise InvalidRequest("give exactly one of text or input_ids", param="text")
    if text is not None:
        return _text_prompts(text), "text", isinstance(text, list)
    is_batch = isinstance(ids, list) and len(ids) > 0 and isinstance(ids[0], list)
    prompts = ids if is_batch else [ids]
    for p in prompts:
        _check_ids(p)
    return prompts, "input_ids", is_batch


def _text_prompts(text: Any) -> list[str]:
    prompts = text if isinstance(text, list) else [text]
    if isinstance(text, list) and not text:
        raise InvalidRequest("text must not be an empty list", param="text")
    for p in prompts:
        if not isinstance(p, str):
            raise InvalidRequest("text must be a string or a list of strings", param="text")
        if not p:
            raise InvalidRequest("text must not be empty", param="text")
    return prompts


def _check_ids(ids: Any) -> None:
    if not isinstance(ids, list) or not all(_is_int(t) for t in ids):
        msg = "input_ids must be a list of integers or a list of lists of integers"
        raise InvalidRequest(msg, param="input_ids")
    if not ids:
        raise InvalidRequest("input_ids must not be empty", param="input_ids")
    if min(ids) < 0:
        raise InvalidRequest(f"input_ids: token id {min(ids)} is negative", param="input_ids")


MAX_RID_CHARS = 256  # a rid travels in every message of its request


def _rids(rid: Any, n: int, is_batch: bool) -> list[str]:
    if rid is None:
        return [uuid.uuid4().hex for _ in range(n)]
    if any(isinstance(r, str) and len(r) > MAX_RID_CHARS for r in (rid if isinstance(rid, list) else [rid])):
        raise InvalidRequest(f"rid must be at most {MAX_RID_CHARS} characters", param="rid")
    if isinstance(rid, str):
        if not rid:
            raise InvalidRequest("rid must not be empty", param="rid")
        return [f"{rid}_{i}" for i in range(n)] if is_batch else [rid]
    if not isinstance(rid, list) or not all(isinstance(r, str) and r for r in rid):
        raise InvalidRequest("rid must be a non-empty string or a list of them", param="rid")
    if len(rid) != n:
        raise InvalidRequest(f"rid has {len(rid)} entries for {n} prompts", param="rid")
    if len(set(rid)) != n:
        raise InvalidRequest("rid entries must be unique", param="rid")
    return list(rid)


def _sampling_params(value: Any, n: int) -> list[dict[str, Any]]:
    if value is None:
        return [{} for _ in range(n)]
    if isinstance(value, dict):
        return [dict(value) for _ in range(n)]
    if not isinstance(value, list) or not all(isinstance(p, dict) for p in value):
        msg = "sampling_params must be an object or a list of objects"
        raise InvalidRequest(msg, param="sampling_params")
    if len(value) != n:
        msg = f"sampling_params has {len(value)} entries for {n} prompts"
        raise InvalidRequest(msg, param="sampling_params")
    return [dict(p) for p in value]


def _per_item(
    body: dict[str, Any], name: str, n: int, default: Any, ok: Callable[[Any], bool], what: str
) -> list[Any]:
    """A field given once for all prompts or as a list with one value per prompt."""
    value = body.get(name)
    if value is None:
        return [default] * n
    values = value if isinstance(value, list) else [value] * n
    if len(values) != n:
        raise InvalidRequest(f"{name} has {len(values)} entries for {n} prompts", param=name)
    for v in values:
        if not ok(v):
            raise InvalidRequest(f"{name} must be {what}, got {v!r}", param=name)
    return list(values)


def _timeout(value: Any) -> float | None:
    """The request's `timeout`: a positive, finite number of seconds, or None."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise InvalidRequest(f"timeout must be a positive number of seconds, got {value!r}", param="timeout")
    return float(value)


def _scalar(body: dict[str, Any], name: str, default: bool) -> bool:
    value = body.get(name)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise InvalidRequest(f"{name} must be a boolean, got {type(value).__name__}", param=name)
    return value


def _is_bool(x: Any) -> bool:
    return isinstance(x, bool)


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _int_at_least(low: int) -> Callable[[Any], bool]:
    return lambda x: _is_int(x) and x >= low


# ---------------------------------------------------------------- response shapes


def token_logprobs(
    logprobs: Sequence[float | None], ids: Sequence[int], texts: Sequence[str | None]
) -> list[LogprobEntry]:
    """`[[logprob, id, text_or_None], ...]`, one entry per position."""
    return [[lp, tid, text] for lp, tid, text in zip(logprobs, ids, texts)]


def top_logprobs(
    tops: Sequence[TopLogprobsWire | None], decode: Callable[[list[int]], list[str | None]]
) -> list[list[LogprobEntry] | None]:
    """Per position, the top-k as `[[logprob, id, text_or_None], ...]` (None where absent).

    `decode(ids)` returns one text (or None) per id; it is called once for the whole list.
    """
    flat_ids = [int(t) for top in tops if top is not None for t in top[0]]
    texts = iter(decode(flat_ids))
    out: list[list[LogprobEntry] | None] = []
    for top in tops:
        if top is None:
            out.append(None)
            continue
        ids, lps = top[0], top[1]
        out.append([[lp, tid, next(texts)] for tid, lp in zip(ids, lps)])
    return out


# ---------------------------------------------------------------- per-request state


class Group:
    """The states of one generate call: one wake-up event and the indices that have news.

    News for several requests (or several updates of one) between two wake-ups collapse into
    one `take()`, so a slow consumer sees the latest cumulative output, never a backlog.
    """

    def __init__(self) -> None:
        self.size = 0
        self._event = asyncio.Event()
        self._dirty: dict[int, None] = {}  # an ordered set

    def add(self) -> int:
        self.size += 1
        return self.size - 1

    def mark(self, index: int) -> None:
        self._dirty[index] = None
        self._event.set()

    async def take(self) -> list[int]:
        """Wait for news; return the indices that have some (maybe none: a spurious wake)."""
        await self._event.wait()
        self._event.clear()
        news, self._dirty = list(self._dirty), {}
        return news


@dataclass(slots=True, eq=False)
class ReqState:
    """What the main process knows of one request sent to the scheduler (SGLang's ReqState)."""

    req: GenerateReq
    group: Group
    index: int
    return_text_in_logprobs: bool
    created: float = field(default_factory=time.perf_counter)
    text: str = ""
    output_ids: list[int] = field(default_factory=list)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    finish_reason: dict[str, Any] | None = None
    finished: bool = False
    finished_time: float | None = None
    first_token_time: float | None = None
    sent: bool = False
    error: str | None = None  # set by fail_all: the consumer raises RuntimeCrashed(error)
    input_token_logprobs: list[LogprobEntry] = field(default_factory=list)
    output_token_logprobs: list[LogprobEntry] = field(default_factory=list)
    input_top_logprobs: list[list[LogprobEntry] | None] | None = None
    output_top_logprobs: list[list[LogprobEntry] | None] | None = None

    @classmethod
    def for_request(cls, req: GenerateReq, group: Group, text_in_logprobs: bool) -> ReqState:
        state = cls(req, group, group.add(), text_in_logprobs, prompt_tokens=len(req.input_ids))
        if req.return_logprob and req.top_logprobs_num > 0:
            state.input_top_logprobs, state.output_top_logprobs = [], []
        return state

    @property
    def rid(self) -> str:
        return self.req.rid

    @property
    def stream(self) -> bool:
        return self.req.stream

    def finish(self, reason: dict[str, Any], now: float) -> None:
        self.finished, self.finish_reason, self.finished_time = True, reason, now


TokenTexts = Callable[[list[int]], list[str | None]]


def apply_output(state: ReqState, out: BatchStrOut, i: int, now: float, texts: TokenTexts) -> None:
    """Fold entry `i` of a BatchStrOut into the state (text and ids accumulate)."""
    new_ids = out.output_ids[i]
    state.text += out.texts[i]
    state.output_ids.extend(new_ids)
    if new_ids and state.first_token_time is None:
        state.first_token_time = now
    state.prompt_tokens = out.prompt_tokens[i]
    state.completion_tokens = out.completion_tokens[i]
    state.cached_tokens = out.cached_tokens[i]
    if state.req.return_logprob:
        _apply_logprobs(state, out, i, texts if state.return_text_in_logprobs else _no_texts)
    reason = out.finished_reasons[i]
    if reason is not None:
        state.finish(reason, now)


def _apply_logprobs(state: ReqState, out: BatchStrOut, i: int, texts: TokenTexts) -> None:
    input_lps, output_lps = out.input_logprobs[i], out.output_logprobs[i]
    if input_lps is not None:
        ids = out.input_ids_for_logprobs[i] or []
        state.input_token_logprobs = token_logprobs(input_lps, ids, texts(ids))
        in_tops = out.input_top_logprobs[i]
        if in_tops is not None and state.input_top_logprobs is not None:
            state.input_top_logprobs = top_logprobs(in_tops, texts)
    if output_lps is not None:
        ids = out.output_ids[i]
        state.output_token_logprobs.extend(token_logprobs(output_lps, ids, texts(ids)))
    out_tops = out.output_top_logprobs[i]
    if out_tops is not None and state.output_top_logprobs is not None:
        state.output_top_logprobs.extend(top_logprobs(out_tops, texts))


def _no_texts(ids: list[int]) -> list[str | None]:
    return [None] * len(ids)


def build_output(state: ReqState) -> dict[str, Any]:
    """SGLang's /generate result: cumulative `text` and `output_ids`, and `meta_info`.

    Lists are copied: the state keeps growing while the consumer holds the dict.
    """
    end = state.finished_time if state.finished_time is not None else time.perf_counter()
    meta: dict[str, Any] = {
        "id": state.rid,
        "finish_reason": state.finish_reason,
        "prompt_tokens": state.prompt_tokens,
        "completion_tokens": state.completion_tokens,
        "cached_tokens": state.cached_tokens,
        "e2e_latency": end - state.created,
    }
    if state.req.return_logprob:
        meta["input_token_logprobs"] = list(state.input_token_logprobs)
        meta["output_token_logprobs"] = list(state.output_token_logprobs)
        meta["input_top_logprobs"] = _copy(state.input_top_logprobs)
        meta["output_top_logprobs"] = _copy(state.output_top_logprobs)
    return {"text": state.text, "output_ids": list(state.output_ids), "meta_info": meta}


def _copy(values: list[Any] | None) -> list[Any] | None:
    return None if values is None else list(values)
