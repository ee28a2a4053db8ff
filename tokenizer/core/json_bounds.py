"""Bounds on the JSON values of an OpenAI body that the server re-serializes, renders or names in
an error: a 400 naming the field instead of a 500 deeper down.

What goes wrong without them:
  - nesting: orjson parses bodies up to 1024 levels, but `repr`, `json.dumps` and Jinja's
    `tojson` recurse once per level and raise RecursionError near Python's limit (~1000); a JSON
    text inside a string (a tool call's `arguments`) has no depth limit until the stdlib parses
    it, and raises RecursionError there;
  - lone surrogates: orjson refuses `"\\ud800"` in a body, but the stdlib parser accepts it inside
    `arguments`, and the tokenizer (Rust) raises TypeError on the rendered prompt; the same holds
    for any string a Python caller passes;
  - numbers: the stdlib reads `1e400` as inf and refuses a 5000-digit integer with a ValueError
    about Python's int-to-str limit; both are out of range here (orjson refuses them in a body).
Walks are iterative (no recursion of their own) and build a value's inner path only on error.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import orjson

from runtime.contracts.errors import InvalidRequest

MAX_DEPTH = 64  # levels in tool arguments and tool parameters (real ones use well under 10)
MIN_INT, MAX_INT = -(2**63), 2**64  # what JSON readers (orjson, most clients) keep as integers
MAX_INT_DIGITS = 20
_DESCRIBE_CHARS = 40


@dataclass(frozen=True, slots=True)
class Bounds:
    """Limits on one value: nesting, and optionally one string's length and the whole size
    (characters of all strings and keys plus one per value)."""

    max_depth: int = MAX_DEPTH
    max_string: int | None = None
    max_total: int | None = None


DEFAULT = Bounds()


def describe(value: Any) -> str:
    """A short rendering of a client value for an error message. NOTE: never `repr` of a
    container (a deep one raises RecursionError); `repr` escapes lone surrogates."""
    if isinstance(value, dict):
        return "an object"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, str):
        return repr(value[:_DESCRIBE_CHARS]) + ("..." if len(value) > _DESCRIBE_CHARS else "")
    if isinstance(value, int) and not MIN_INT <= value < MAX_INT:
        return "an integer out of range"
    if value is None or isinstance(value, (bool, int, float)):
        return repr(value)
    return type(value).__name__


def lone_surrogate_at(text: str) -> int | None:
    """The index of the first lone surrogate in `text`, or None (ASCII is checked in C first)."""
    if text.isascii():
        return None
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        return exc.start
    return None


def check_text(text: str, param: str) -> None:
    """Raise InvalidRequest naming `param` if `text` holds a lone surrogate."""
    at = lone_surrogate_at(text)
    if at is not None:
        raise InvalidRequest(f"{param} holds a lone surrogate (U+{ord(text[at]):04X} at character "
                             f"{at}), which is not valid Unicode", param=param)


def check_value(value: Any, param: str, bounds: Bounds = DEFAULT) -> None:
    """Raise InvalidRequest naming `param` unless `value` is plain JSON within `bounds`."""
    problem = find_problem(value, bounds)
    if problem is not None:
        raise InvalidRequest(f"{param} {problem}", param=param)


def find_problem(value: Any, bounds: Bounds = DEFAULT) -> str | None:
    """What breaks `bounds` in `value` (a phrase naming the inner path), or None."""
    total = 0
    # (item, depth, path): path is a linked (parent path, key) pair, turned into text on error.
    stack: list[tuple[Any, int, Any]] = [(value, 0, None)]
    while stack:
        item, depth, path = stack.pop()
        total += 1
        if isinstance(item, (dict, list)):
            if depth >= bounds.max_depth:
                return f"is nested too deeply (more than {bounds.max_depth} levels)"
            pairs: Iterable[tuple[Any, Any]] = item.items() if isinstance(item, dict) else enumerate(item)
            for key, sub in pairs:
                if isinstance(item, dict):
                    problem = _key_problem(key, bounds)
                    if problem is not None:
                        return _at(path, problem)
                    total += len(key)  # a str: _key_problem checked it
                stack.append((sub, depth + 1, (path, key)))
        else:
            problem = _scalar_problem(item, bounds)
            if problem is not None:
                return _at(path, problem)
            total += len(item) if isinstance(item, str) else 0
        if bounds.max_total is not None and total > bounds.max_total:
            return f"is too large (more than {bounds.max_total} characters and values)"
    return None


def _key_problem(key: Any, bounds: Bounds) -> str | None:
    if not isinstance(key, str):
        return f"has a key that is not a string ({type(key).__name__})"
    return _scalar_problem(key, bounds)


def _scalar_problem(item: Any, bounds: Bounds) -> str | None:
    if isinstance(item, str):
        if bounds.max_string is not None and len(item) > bounds.max_string:
            return f"holds a string longer than {bounds.max_string} characters"
        at = lone_surrogate_at(item)
        if at is not None:
            return f"holds a lone surrogate (U+{ord(item[at]):04X}), not valid Unicode"
        return None
    if item is None or isinstance(item, bool):
        return None
    if isinstance(item, int):
        return None if MIN_INT <= item < MAX_INT else "holds an integer out of range"
    if isinstance(item, float):
        return None if math.isfinite(item) else "holds a number that is not finite"
    return f"holds a value that is not JSON ({type(item).__name__})"


def _at(path: Any, problem: str) -> str:
    keys: list[Any] = []
    while path is not None:
        path, key = path
        keys.append(key)
    inner = "".join(f"[{k}]" if isinstance(k, int) else f".{k}" for k in reversed(keys))
    return f"{problem} at {inner[:200]}" if inner else problem


# ---------------------------------------------------------------- JSON inside a string


class _OutOfRange(ValueError):
    """A number the stdlib parser would read but which is out of range here."""


_NOT_JSON = object()


def load_json_text(text: str, param: str, bounds: Bounds = DEFAULT) -> Any:
    """The value of the JSON `text` (a tool call's `arguments`), or `text` itself when it is not
    JSON at all (kept as the client wrote it: a history is rendered, not judged).

    Raises:
        InvalidRequest: `text` is JSON out of `bounds`: nested too deeply, a lone surrogate, a
            number out of range (the cases where the stdlib parser fails or yields what the
            tokenizer cannot take).
    """
    try:
        value = orjson.loads(text)  # NOTE: no recursion, no lone surrogates, no inf: the fast path
    except orjson.JSONDecodeError:
        value = _stdlib_value(text, param)
        if value is _NOT_JSON:
            check_text(text, param)
            return text
    check_value(value, param, bounds)
    return value


def _stdlib_value(text: str, param: str) -> Any:
    """What the stdlib makes of JSON that orjson refused: out of range (a 400), or not JSON."""
    try:
        return json.loads(text, parse_constant=_no_constant, parse_int=_bounded_int)
    except RecursionError:
        raise InvalidRequest(f"{param} is nested too deeply", param=param) from None
    except _OutOfRange as exc:
        raise InvalidRequest(f"{param} {exc}", param=param) from None
    except ValueError:
        return _NOT_JSON


def _no_constant(name: str) -> Any:
    raise _OutOfRange(f"holds {name}, which is not a JSON number")


def _bounded_int(digits: str) -> int:
    if len(digits.lstrip("-")) > MAX_INT_DIGITS:
        raise _OutOfRange("holds an integer out of range")
    return int(digits)
