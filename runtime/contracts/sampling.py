"""Per-request sampling parameters: SGLang's field names and defaults, parsing and validation.

A JSON body's `sampling_params` maps 1:1 onto `SamplingParams` (plus `sampling_seed`, SGLang's
name for `seed`). `from_dict` checks names and types; `validate` checks ranges once the vocabulary
size is known. Both raise `InvalidRequest` naming the offending field, which becomes an HTTP 400.

Choices where SGLang is silent or differs:
  - A JSON `null` for a field whose default is not None means "use the default".
  - `repetition_penalty` must be in (0, 2] (SGLang allows 0, which would divide by zero).
  - `logit_bias` values outside [-100, 100] are rejected, not clipped (OpenAI returns 400 too).
    Keys may be token-id strings (OpenAI) or ints; `from_dict` stores int keys and `to_dict`
    writes string keys so the wire form is plain JSON.
  - `json_schema` may be given as an object; it is stored as its JSON text, as SGLang expects.
  - `seed` is None by default (unseeded rows draw from the server's generator); `sampling_seed` is
    accepted as an alias and stored as `seed`.
  - `grammar_after_ids` (ours; the chat routes set it under --reasoning-parser): the grammar
    (json_schema, regex or ebnf, which it requires) constrains only what follows the first place
    the output ends with these ids, the reasoning's end marker; the tokens before are free.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, fields
from typing import Any

from runtime.contracts.errors import InvalidRequest
from runtime.contracts.json_text import client_json

MAX_STOP_STRS = 16
MAX_STOP_STR_CHARS = 512  # each stop string is matched against the output's tail every step
MAX_STOP_TOKEN_IDS = 256
MAX_GRAMMAR_AFTER_IDS = 16
MAX_LOGIT_BIAS_ENTRIES = 1024  # OpenAI accepts up to 300; every entry costs work every step
MAX_LOGIT_BIAS = 100.0
GREEDY_EPS = 1e-6
_SEED_LIMIT = 1 << 63
_TOKEN_ID_STR = re.compile(r"-?[0-9]+")

_FLOAT_FIELDS = (
    "temperature", "top_p", "min_p", "frequency_penalty", "presence_penalty", "repetition_penalty",
)
_INT_FIELDS = ("max_new_tokens", "top_k", "min_new_tokens", "n")
_OPT_INT_FIELDS = ("seed", "stream_interval")
_BOOL_FIELDS = (
    "ignore_eos", "skip_special_tokens", "spaces_between_special_tokens", "no_stop_trim",
)
_OPT_STR_FIELDS = ("regex", "ebnf")
GRAMMAR_FIELDS = ("json_schema", "regex", "ebnf")  # at most one per request
ANY_JSON = "$$ANY$$"  # SGLang's json_schema sentinel: any JSON value


@dataclass(slots=True)
class SamplingParams:
    """How one request samples and when it stops. Defaults are SGLang's."""

    max_new_tokens: int = 128
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    min_p: float = 0.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    repetition_penalty: float = 1.0
    min_new_tokens: int = 0
    n: int = 1
    json_schema: str | None = None
    regex: str | None = None
    ebnf: str | None = None
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    no_stop_trim: bool = False
    logit_bias: dict[int, float] | dict[str, float] | None = None
    seed: int | None = None
    stream_interval: int | None = None
    grammar_after_ids: list[int] | None = None

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> SamplingParams:
        """Parse a JSON object; unknown keys and wrong types raise `InvalidRequest`.

        Ranges are not checked here: call `validate(vocab_size)` afterwards.
        """
        if not isinstance(d, dict):
            raise InvalidRequest.field("sampling_params", "must be an object")
        d = dict(d)
        if "sampling_seed" in d:
            if "seed" in d:
                raise InvalidRequest.field("seed", "give seed or sampling_seed, not both")
            d["seed"] = d.pop("sampling_seed")
        names = {f.name for f in fields(cls)}
        unknown = sorted(k for k in d if k not in names)
        if unknown:
            name = str(unknown[0])
            raise InvalidRequest.field(name, "unknown sampling parameter")
        defaults = cls()
        kwargs = {k: getattr(defaults, k) if v is None else v for k, v in d.items()}
        if isinstance(kwargs.get("json_schema"), dict):
            kwargs["json_schema"] = client_json(kwargs["json_schema"], "json_schema")
        params = cls(**kwargs)
        params._check_types()
        if params.logit_bias is not None:
            params.logit_bias = dict(params.logit_bias_ids())
        return params

    def to_dict(self) -> dict[str, Any]:
        """The wire form: plain JSON types only (logit_bias keys become strings)."""
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        if self.stop is not None and not isinstance(self.stop, str):
            out["stop"] = list(self.stop)
        if self.stop_token_ids is not None:
            out["stop_token_ids"] = list(self.stop_token_ids)
        if self.grammar_after_ids is not None:
            out["grammar_after_ids"] = list(self.grammar_after_ids)
        if self.logit_bias is not None:
            out["logit_bias"] = {str(k): float(v) for k, v in self.logit_bias.items()}
        return out

    @property
    def is_greedy(self) -> bool:
        return self.temperature < GREEDY_EPS or self.top_k == 1

    @property
    def stop_strs(self) -> list[str]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)

    def logit_bias_ids(self) -> list[tuple[int, float]]:
        """`logit_bias` as (token id, bias) pairs; raises `InvalidRequest` on a bad key or value."""
        if self.logit_bias is None:
            return []
        if not isinstance(self.logit_bias, dict):
            raise _bad("logit_bias", "must be an object of token id -> bias")
        if len(self.logit_bias) > MAX_LOGIT_BIAS_ENTRIES:
            raise _bad("logit_bias", f"may have at most {MAX_LOGIT_BIAS_ENTRIES} entries, got {len(self.logit_bias)}")
        items = []
        for key, value in self.logit_bias.items():
            if isinstance(key, str) and _TOKEN_ID_STR.fullmatch(key):
                tid = int(key)
            elif isinstance(key, int) and not isinstance(key, bool):
                tid = key
            else:
                raise _bad("logit_bias", f"key {str(key)[:40]!r} is not a token id")
            if not _is_number(value):
                raise _bad("logit_bias", f"the value for {str(key)[:40]!r} must be a number")
            items.append((tid, float(value)))
        return items

    def _check_types(self) -> None:
        for name in _FLOAT_FIELDS:
            value = getattr(self, name)
            if not _is_number(value):
                raise _bad(name, f"must be a number, got {_tname(value)}")
            setattr(self, name, float(value))
        for name in _INT_FIELDS + _OPT_INT_FIELDS:
            value = getattr(self, name)
            if value is None and name in _OPT_INT_FIELDS:
                continue
            if not _is_int(value):
                raise _bad(name, f"must be an integer, got {_tname(value)}")
        for name in _BOOL_FIELDS:
            value = getattr(self, name)
            if not isinstance(value, bool):
                raise _bad(name, f"must be a boolean, got {_tname(value)}")
        for name in _OPT_STR_FIELDS + ("json_schema",):
            value = getattr(self, name)
            if value is not None and not isinstance(value, str):
                raise _bad(name, f"must be a string, got {_tname(value)}")
        self._check_list_types()

    def _check_list_types(self) -> None:
        stop = self.stop
        if (stop is not None and not isinstance(stop, str)
                and (not isinstance(stop, (list, tuple)) or not all(isinstance(s, str) for s in stop))):
            raise _bad("stop", "must be a string or a list of strings")
        for name in ("stop_token_ids", "grammar_after_ids"):
            ids = getattr(self, name)
            if ids is not None and (not isinstance(ids, (list, tuple)) or not all(_is_int(t) for t in ids)):
                raise _bad(name, "must be a list of integers")
        self.logit_bias_ids()

    def validate(self, vocab_size: int | None = None) -> None:
        """Check types and ranges; token ids are checked against `vocab_size` when given.

        Raises:
            InvalidRequest: naming the first bad field, with its allowed range in the message.
        """
        self._check_types()
        for name, ok, allowed in self._range_checks():
            if not ok:
                raise _bad(name, f"must be {allowed}, got {getattr(self, name)!r}")
        self._validate_stops(vocab_size)
        for tid, bias in self.logit_bias_ids():
            _check_token_id(tid, vocab_size, "logit_bias")
            if not (math.isfinite(bias) and abs(bias) <= MAX_LOGIT_BIAS):
                raise _bad("logit_bias", f"values must be in [-100, 100], got {bias!r} for token {tid}")
        given = [g for g in GRAMMAR_FIELDS if getattr(self, g) is not None]
        if len(given) > 1:
            raise _bad(given[1], f"at most one of json_schema, regex, ebnf may be given, got {given}")
        self._validate_grammar_after(vocab_size, bool(given))

    def _range_checks(self) -> list[tuple[str, bool, str]]:
        def finite(x: float) -> bool:
            return math.isfinite(x)

        return [
            ("temperature", finite(self.temperature) and self.temperature >= 0, ">= 0 and finite"),
            ("top_p", 0 < self.top_p <= 1, "in (0, 1]"),
            ("top_k", self.top_k == -1 or self.top_k >= 1, "-1 (all tokens) or >= 1"),
            ("min_p", 0 <= self.min_p <= 1, "in [0, 1]"),
            ("frequency_penalty", -2 <= self.frequency_penalty <= 2, "in [-2, 2]"),
            ("presence_penalty", -2 <= self.presence_penalty <= 2, "in [-2, 2]"),
            ("repetition_penalty", 0 < self.repetition_penalty <= 2, "in (0, 2]"),
            ("max_new_tokens", self.max_new_tokens >= 0, ">= 0"),
            ("min_new_tokens", 0 <= self.min_new_tokens <= self.max_new_tokens,
             f"in [0, max_new_tokens={self.max_new_tokens}]"),
            ("n", self.n >= 1, ">= 1"),
            ("seed", self.seed is None or 0 <= self.seed < _SEED_LIMIT, "in [0, 2**63)"),
            ("stream_interval", self.stream_interval is None or self.stream_interval >= 1, ">= 1"),
        ]

    def _validate_stops(self, vocab_size: int | None) -> None:
        strs = self.stop_strs
        if len(strs) > MAX_STOP_STRS:
            raise _bad("stop", f"at most {MAX_STOP_STRS} stop strings are allowed, got {len(strs)}")
        if any(s == "" for s in strs):
            raise _bad("stop", "stop strings must be non-empty")
        if any(len(s) > MAX_STOP_STR_CHARS for s in strs):
            raise _bad("stop", f"stop strings must be at most {MAX_STOP_STR_CHARS} characters long")
        if len(self.stop_token_ids or []) > MAX_STOP_TOKEN_IDS:
            raise _bad("stop_token_ids", f"at most {MAX_STOP_TOKEN_IDS} are allowed")
        for tid in self.stop_token_ids or []:
            _check_token_id(tid, vocab_size, "stop_token_ids")


    def _validate_grammar_after(self, vocab_size: int | None, has_grammar: bool) -> None:
        ids = self.grammar_after_ids
        if ids is None:
            return
        if not has_grammar:
            raise _bad("grammar_after_ids", "needs a grammar (json_schema, regex or ebnf)")
        if not 1 <= len(ids) <= MAX_GRAMMAR_AFTER_IDS:
            raise _bad("grammar_after_ids", f"must hold 1 to {MAX_GRAMMAR_AFTER_IDS} token ids, got {len(ids)}")
        for tid in ids:
            _check_token_id(tid, vocab_size, "grammar_after_ids")


def _bad(param: str, problem: str) -> InvalidRequest:
    return InvalidRequest.field(param, problem)


def _is_number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _tname(x: Any) -> str:
    return type(x).__name__


def _check_token_id(tid: int, vocab_size: int | None, param: str) -> None:
    if tid < 0 or (vocab_size is not None and tid >= vocab_size):
        allowed = f"[0, {vocab_size})" if vocab_size is not None else ">= 0"
        raise _bad(param, f"token id {tid} is outside {allowed}")
