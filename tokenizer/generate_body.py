"""SGLang's native `/generate` body, normalized into single requests (structure and types only: no
tokenizer, no model limits; every rejection is an `InvalidRequest` naming the field).

    text | input_ids          exactly one: str | list[str], or list[int] | list[list[int]]
    sampling_params           dict (shared by the batch) | list[dict] (one per prompt) | None
    rid                       str (a batch gets f"{rid}_{i}") | list[str] | None (uuid4 hex)
    return_logprob            bool | list[bool]            default False
    logprob_start_len         int | list[int]  (>= -1)     default -1 (output logprobs only)
    top_logprobs_num          int | list[int]  (>= 0)      default 0
    return_text_in_logprobs   bool                         default False
    stream                    bool                         default False
    timeout                   number > 0 (seconds)         default --request-timeout (none)
    priority                  int                          with --enable-priority-scheduling (larger
                                                           first); a 400 without it
    extra_key                 str (<= 1024 chars)          the prefix-cache namespace (SGLang's name):
                                                           requests with different keys never share
                                                           cached KV, so one tenant's hits and timing
                                                           say nothing of another's prompts

Unknown keys are ignored, as SGLang does. A JSON null means "the default".
"""

from __future__ import annotations

import math
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from runtime.contracts.errors import InvalidRequest


@dataclass(slots=True)
class SingleRequest:
    """One prompt of a /generate call, before tokenization (exactly one of text / input_ids)."""

    rid: str  # a label: the result's id and a name /abort_request accepts (tokenizer/labels.py)
    text: str | None = None
    input_ids: list[int] | None = None
    sampling_params: dict[str, Any] = field(default_factory=dict)
    return_logprob: bool = False
    logprob_start_len: int = -1
    top_logprobs_num: int = 0
    return_text_in_logprobs: bool = False
    stream: bool = False
    timeout: float | None = None  # seconds from arrival; past it the request is aborted
    extra_key: str | None = None  # prefix-cache namespace (tenant isolation)
    priority: int | None = None
    group_rid: str | None = None  # a batch's one string rid, which aborts every prompt of it

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
    extra_key = cache_namespace(body.get("extra_key"), "extra_key")
    priority = body.get("priority")
    if priority is not None and not (_is_int(priority) and abs(priority) < 2**31):
        raise InvalidRequest("priority must be an integer (32-bit)", param="priority")
    group_rid = body.get("rid") if is_batch and isinstance(body.get("rid"), str) else None
    requests = [
        SingleRequest(
            rid=rids[i],
            group_rid=group_rid,
            text=prompts[i] if field_name == "text" else None,
            input_ids=prompts[i] if field_name == "input_ids" else None,
            sampling_params=params[i],
            return_logprob=return_logprob[i],
            logprob_start_len=start_len[i],
            top_logprobs_num=top_num[i],
            return_text_in_logprobs=text_in_lp,
            stream=stream,
            timeout=timeout,
            extra_key=extra_key,
            priority=priority,
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
    assert ids is not None  # exactly one of the two was given
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


MAX_CACHE_KEY_CHARS = 1024


def cache_namespace(value: Any, field_name: str) -> str | None:
    """A prefix-cache namespace (`extra_key`, OpenAI's `cache_salt`): a non-empty string, or None."""
    if value is None:
        return None
    if not isinstance(value, str) or not value:
        raise InvalidRequest(f"{field_name} must be a non-empty string", param=field_name)
    if len(value) > MAX_CACHE_KEY_CHARS:
        raise InvalidRequest(f"{field_name} must be at most {MAX_CACHE_KEY_CHARS} characters", param=field_name)
    return value


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
