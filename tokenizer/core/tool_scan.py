"""Lexing the JSON of tool calls in a growing output, for `tool_calls.ToolCallStream` (pure).

A call object is read in two parts:

    {"name": "get_weather", "arguments": {"city": "Par ...
    └──────────── head ────────────────┘└── value ──────

  - `match_head` reads the head again on every feed until it is decided (it is short): a known
    tool's name first, then `}` (no arguments) or `"arguments"` / `"parameters"` and the value's
    first character (`{`: an object, `"`: arguments given as a JSON string).
  - `JsonSpan` follows an object value as it grows, once (resumable, no recursion): it tracks
    strings and escapes and counts brackets, so it knows where the value closes without
    validating it; inside a `<tool_call>` block an unquoted `</tool_call>` cuts it short.
"""

from __future__ import annotations

import re
from collections.abc import Collection
from dataclasses import dataclass

OPEN_TAG, CLOSE_TAG = "<tool_call>", "</tool_call>"  # Hermes / Qwen blocks
MORE, FAIL = "more", "fail"  # match_head: undecided until more text comes / not a call head
_WS = re.compile(r"[ \t\n\r]*")
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"', re.DOTALL)
_OUTSIDE = re.compile(r'[{}\[\]"<]')
_INSIDE = re.compile(r'[\\"]')


def skip_ws(text: str, i: int) -> int:
    """The index of the first non-whitespace character at or after `i` (JSON's whitespace)."""
    m = _WS.match(text, i)
    return m.end() if m else i


@dataclass(frozen=True, slots=True)
class Head:
    """A decided head. `kind`: none (no arguments; `end` is past the object's `}`), object or
    string (`end` is the index of the value's first character)."""

    name: str
    kind: str
    end: int


class _More(Exception):
    pass


class _Fail(Exception):
    pass


class _Cursor:
    def __init__(self, text: str, i: int) -> None:
        self.text, self.i = text, i

    def ws(self) -> None:
        self.i = skip_ws(self.text, self.i)
        if self.i >= len(self.text):
            raise _More

    def literal(self, *options: str) -> None:
        rest = self.text[self.i:self.i + max(len(o) for o in options)]
        for option in options:
            if rest.startswith(option):
                self.i += len(option)
                return
        if any(o.startswith(rest) for o in options) and self.i + len(rest) == len(self.text):
            raise _More
        raise _Fail

    def name(self, names: Collection[str]) -> str:
        """A known name in quotes (names have no escapes: `constraints._NAME`)."""
        self.literal('"')
        end = self.text.find('"', self.i)
        partial = self.text[self.i:] if end < 0 else self.text[self.i:end]
        if end < 0:
            raise _More if any(n.startswith(partial) for n in names) else _Fail
        if partial not in names:
            raise _Fail
        self.i = end + 1
        return partial

    def peek(self) -> str:
        if self.i >= len(self.text):
            raise _More
        return self.text[self.i]


def match_head(text: str, start: int, names: Collection[str], finished: bool) -> Head | str:
    """The call head at `text[start]` (a `{`): a `Head`, FAIL, or MORE when `text` is a prefix
    of a head (FAIL instead once the output is `finished`)."""
    c = _Cursor(text, start)
    try:
        c.literal("{")
        c.ws()
        c.literal('"name"')
        c.ws()
        c.literal(":")
        c.ws()
        name = c.name(names)
        c.ws()
        if c.peek() == "}":
            return Head(name, "none", c.i + 1)
        c.literal(",")
        c.ws()
        c.literal('"arguments"', '"parameters"')
        c.ws()
        c.literal(":")
        c.ws()
        first = c.peek()
    except _More:
        return FAIL if finished else MORE
    except _Fail:
        return FAIL
    if first in "{\"":
        return Head(name, "object" if first == "{" else "string", c.i)
    return FAIL


def match_string(text: str, start: int, limit: int) -> int | None:
    """The end of the JSON string at `text[start]` (a `"`) if it closes before `limit`."""
    m = _STRING.match(text, start, limit)
    return m.end() if m else None


class JsonSpan:
    """Where a JSON value that opened at `start` (an object: depth 1 past its `{`) closes, in a
    text that grows between calls to `advance`. `tag`: an unquoted occurrence ends the value
    there (`cut`); a partial one at the end of the text is held until it is decided."""

    def __init__(self, start: int, tag: str | None, depth: int = 0) -> None:
        self.i, self.tag, self.depth = start, tag, depth
        self.in_string = self.escape = False
        self.closed = self.cut = False

    @property
    def done(self) -> bool:
        return self.closed or self.cut

    def advance(self, text: str, finished: bool) -> int:
        """Read on through `text`; returns the index up to which it belongs to the value."""
        while not self.done and self.i < len(text):
            if self.in_string:
                self._in_string(text)
                continue
            m = _OUTSIDE.search(text, self.i)
            if m is None:
                self.i = len(text)
                break
            k, ch = m.start(), m.group()
            if ch == "<":
                if self.tag is not None and text.startswith(self.tag, k):
                    self.i, self.cut = k, True
                    break
                if self.tag is not None and self.tag.startswith(text[k:]) and not finished:
                    self.i = k  # a partial tag: decided by what comes next
                    break
            elif ch == '"':
                self.in_string = True
            elif ch in "{[":
                self.depth += 1
            else:
                self.depth -= 1
                self.closed = self.depth <= 0
            self.i = k + 1
        return self.i

    def _in_string(self, text: str) -> None:
        if self.escape:
            self.escape, self.i = False, self.i + 1
            return
        m = _INSIDE.search(text, self.i)
        if m is None:
            self.i = len(text)
        elif m.group() == "\\":
            self.escape, self.i = True, m.end()
        else:
            self.in_string, self.i = False, m.end()
