"""Reading OpenAI tool calls out of generated text, whole or as it streams (pure: no tokenizer,
no I/O). Prompts: `tool_prompts.py`; request validation and forced-call grammars:
`tools.py`; the lexing of call JSON: `tool_scan.py`.

The public API (the chat route, `api.py`, uses all of it):

    stream = ToolCallStream.for_plan(plan, server_parser)   # a request's ToolPlan; or
                                                            # ToolCallStream(names, forced, parser)
    for text, finished in outputs:                          # cumulative text, as the manager sends it
        for event in stream.events(text, finished):         # ContentDelta | CallStarted |
            ...                                             # ArgumentsDelta | CallFinished
    parsed = parse_for_plan(text, plan, server_parser)      # the same scan over a finished output
                                                            # (parse_tool_calls(text, names, parser))

  - `ContentDelta(text)`: content that can no longer turn into a call. Held back: a possible
    start of a call (a partial `<tool_call>`, a leading `{`, `[` or `<|python_tag|>` until the
    call's name and arguments key decide it) and content that is all whitespace so far (a
    blank content beside calls is None).
  - `CallStarted(index, id, name)` once the call is certain, before its arguments; then
    `ArgumentsDelta(index, text)` fragments as they are generated; then `CallFinished(index,
    call)` with the whole `ToolCall` (the same id). `index` counts the choice's calls from 0.
  - Joined, the events equal `parse_tool_calls` of the finished text, whatever the chunking:
    content pieces join to `ParsedOutput.content` (None when calls exist and the content is
    blank), each call's fragments to its `arguments`.
  - `arguments` is the raw JSON text the model wrote for the arguments object (its spacing kept,
    not re-serialized), so a fragment is sent as soon as it is generated and never changes.
    Like OpenAI's, it may be invalid JSON: cut by max_tokens, or whatever an unconstrained model
    wrote. Arguments given as a JSON string (`"arguments": "{...}"`) are decoded and sent in one
    fragment once the string closes (it must hold a JSON object).
  - `chat_delta(event)` is an event as a chat.completion.chunk `delta` (None for content and
    CallFinished, which chat does not send).
  - `stream.feed(text, finished)` -> (content delta, all calls once finished, else []) is the
    shortcut for a route that sends calls whole at the end.

Formats (`--tool-call-parser`; SGLang's names). A call is a JSON object whose first key is
"name" (a known tool), then optionally "arguments" (or Llama 3.1's "parameters"); other keys
after the arguments are ignored.
  - hermes / qwen25 (Hermes and Qwen2.5/Qwen3): `<tool_call>` CALL `</tool_call>` blocks
    anywhere in the text (the closing tag may be missing); a block that is not a call stays in
    the content as text, through its closing tag.
  - llama3 (Llama 3.x): at the start of the output (after whitespace and an optional
    `<|python_tag|>`), calls joined by `;` or whitespace, or a JSON array of calls (the shape of
    a forced call's grammar with several calls); what follows the last call is content.
  - auto (the default): both; a forced call (tool_choice required or named) is always read so.
With at most one call allowed (parallel_tool_calls false), later calls are read and dropped.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Collection
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import orjson

from runtime.contracts.stop import partial_stop_suffix_len
from tokenizer.core.tool_scan import (
    CLOSE_TAG,
    FAIL,
    MORE,
    OPEN_TAG,
    Head,
    JsonSpan,
    match_head,
    match_string,
    skip_ws,
)

if TYPE_CHECKING:
    from tokenizer.core.tools import ToolPlan

PYTHON_TAG = "<|python_tag|>"
PARSERS = ("auto", "hermes", "qwen25", "llama3")


@dataclass(frozen=True, slots=True)
class ToolCall:
    """One parsed call; `arguments` is JSON text, as OpenAI returns it."""

    name: str
    arguments: str
    id: str

    def to_openai(self) -> dict[str, Any]:
        return {"id": self.id, "type": "function",
                "function": {"name": self.name, "arguments": self.arguments}}


@dataclass(frozen=True, slots=True)
class ParsedOutput:
    """An output split into content (None when calls exist and it is blank) and calls."""

    content: str | None
    calls: list[ToolCall]


@dataclass(frozen=True, slots=True)
class ContentDelta:
    text: str


@dataclass(frozen=True, slots=True)
class CallStarted:
    index: int
    id: str
    name: str


@dataclass(frozen=True, slots=True)
class ArgumentsDelta:
    index: int
    text: str


@dataclass(frozen=True, slots=True)
class CallFinished:
    index: int
    call: ToolCall


ToolEvent = ContentDelta | CallStarted | ArgumentsDelta | CallFinished


# ---------------------------------------------------------------- parsing and streaming


def new_call_id() -> str:
    return "call_" + uuid.uuid4().hex[:24]


def parse_tool_calls(text: str, names: Collection[str], parser: str = "auto",
                     max_calls: int | None = None) -> ParsedOutput:
    """Calls of known tools in a finished output: the stream's scan over the whole text."""
    return _parsed(ToolCallStream(names, False, parser, max_calls=max_calls), text)


def parse_for_plan(text: str, plan: ToolPlan, server_parser: str) -> ParsedOutput:
    """`parse_tool_calls` as `ToolCallStream.for_plan` reads a request's output."""
    return _parsed(ToolCallStream.for_plan(plan, server_parser), text)


def _parsed(stream: ToolCallStream, text: str) -> ParsedOutput:
    events = stream.events(text, True)
    calls = [e.call for e in events if isinstance(e, CallFinished)]
    content = "".join(e.text for e in events if isinstance(e, ContentDelta))
    return ParsedOutput(None if calls and not content.strip() else content, calls)


def chat_delta(event: ToolEvent) -> dict[str, Any] | None:
    """A call event as a chat.completion.chunk delta, as OpenAI streams calls: index, id, type and
    name first, then argument fragments (the `openai` client joins them by index)."""
    if isinstance(event, CallStarted):
        return {"tool_calls": [{"index": event.index, "id": event.id, "type": "function",
                                "function": {"name": event.name, "arguments": ""}}]}
    if isinstance(event, ArgumentsDelta):
        return {"tool_calls": [{"index": event.index, "function": {"arguments": event.text}}]}
    return None


@dataclass(slots=True)
class _OpenCall:
    index: int
    id: str
    name: str
    keep: bool  # False past max_calls: read and dropped
    args_at: int = 0


class ToolCallStream:
    """One choice's output, fed as it grows (cumulative text): the events to send now; see the
    module docstring.

    A scan with one state per place in the formats:

        lead ─ { [ <|python_tag|> ─> bare_open ─> head ─> args ─> tail ─> bare_sep ─> head ...
          └─ anything else ─> text ─ <tool_call> ─> block_open ─> head ─> args ─> tail ─> block_end ─> text
        (head ─> string_args for arguments in a JSON string; tail ─> tail_span for keys after
        the arguments; a head that fails: text, or failed_block inside a block)

    NOTE: `pos` is how far the text is decided (its events sent), `mark` where an undecided call
    began: if it turns out not to be a call, the text from `mark` is content. A state's step
    returns False when it needs more text; once the output is finished no step waits, so the
    scan ends with everything decided. `calls` holds the finished calls sent so far.
    """

    def __init__(self, names: Collection[str], forced: bool = False, parser: str = "auto", *,
                 max_calls: int | None = None, new_id: Callable[[], str] = new_call_id) -> None:
        """`forced`: a forced call's output, read with the auto rules (its grammar writes bare
        JSON whatever the server's parser); `max_calls`: calls past it are read and dropped."""
        parser = "auto" if forced else parser
        self.names, self.max_calls, self.new_id = names, max_calls, new_id
        self.bare, self.blocks = parser in ("auto", "llama3"), parser != "llama3"
        self.state, self.pos, self.mark = "lead", 0, 0
        self.in_block = self.in_array = False
        self.calls: list[ToolCall] = []  # finished calls, as sent
        self._started = 0  # calls begun, dropped ones included
        self._call: _OpenCall | None = None
        self._span: JsonSpan | None = None
        self._head: Head | None = None
        self._blank = ""  # content held while all of it is whitespace
        self._shown = False
        self._buf = ""  # push(): the undecided tail of the output
        self._out: list[ToolEvent] = []
        self._steps: dict[str, Callable[[str, bool], bool]] = {
            "lead": self._lead, "bare_open": self._bare_open, "head": self._read_head,
            "args": self._read_args, "string_args": self._string_args, "tail": self._tail,
            "tail_span": self._tail_span, "block_end": self._block_end, "bare_sep": self._bare_sep,
            "text": self._text, "block_open": self._block_open, "failed_block": self._failed_block}

    @classmethod
    def for_plan(cls, plan: ToolPlan, server_parser: str,
                 new_id: Callable[[], str] = new_call_id) -> ToolCallStream:
        """The stream for a request's tools: a forced call's grammar writes bare JSON whatever
        the server's parser; parallel_tool_calls false keeps only the first call."""
        return cls(plan.names, plan.choice.forced, server_parser, max_calls=None if plan.parallel else 1,
                   new_id=new_id)

    def feed(self, text: str, finished: bool) -> tuple[str, list[ToolCall]]:
        """(content to send now, every call once `finished`, else []) for the cumulative `text`."""
        events = self.events(text, finished)
        content = "".join(e.text for e in events if isinstance(e, ContentDelta))
        return content, list(self.calls) if finished else []

    def push(self, delta: str, finished: bool) -> list[ToolEvent]:
        """The events for `delta`, the text that followed what was pushed before. The stream
        keeps only its undecided tail (`_rebase`), so a push costs the delta and that tail, not
        the whole output."""
        self._buf += delta
        events = self.events(self._buf, finished)
        self._rebase()
        return events

    def _rebase(self) -> None:
        """Drop the decided text before every position a later step may read again: `pos`, an
        undecided call's `mark`, an open call's arguments and a string head's end."""
        keep = self.pos
        if self.state not in ("text", "lead", "end"):
            keep = min(keep, self.mark)
        if self._call is not None:
            keep = min(keep, self._call.args_at)
        if self.state == "string_args" and self._head is not None:
            keep = min(keep, self._head.end)
        if keep <= 0:
            return
        self._buf = self._buf[keep:]
        self.pos -= keep
        self.mark = max(self.mark - keep, 0)
        if self._call is not None:
            self._call.args_at -= keep
        if self._span is not None:
            self._span.i = max(self._span.i - keep, 0)
        if self._head is not None:
            self._head = replace(self._head, end=max(self._head.end - keep, 0))

    def events(self, text: str, finished: bool) -> list[ToolEvent]:
        """The events for the cumulative `text` (which only grows) since the last call."""
        assert len(text) >= self.pos, "the output text only grows"
        self._out = []
        while self.state != "end":
            if not self._steps[self.state](text, finished):
                assert not finished, f"the tool-call scan waits in {self.state} at the end"
                break
        if finished and self._blank and not self.calls:
            self._out.append(ContentDelta(self._blank))
            self._blank = ""
        return _merged(self._out)

    # -- events

    def _content(self, text: str) -> None:
        if not text:
            return
        if self._shown:
            self._out.append(ContentDelta(text))
            return
        self._blank += text
        if self._blank.strip():
            self._out.append(ContentDelta(self._blank))
            self._blank, self._shown = "", True

    def _begin(self, name: str, args_at: int) -> None:
        index = self._started
        self._started += 1
        call = _OpenCall(index, self.new_id(), name, self.max_calls is None or index < self.max_calls, args_at)
        if call.keep:
            self._out.append(CallStarted(index, call.id, name))
        self._call = call

    def _arguments(self, text: str) -> None:
        assert self._call is not None
        if text and self._call.keep:
            self._out.append(ArgumentsDelta(self._call.index, text))

    def _end(self, arguments: str) -> None:
        call, self._call = self._call, None
        assert call is not None
        if call.keep:
            done = ToolCall(call.name, arguments, call.id)
            self.calls.append(done)
            self._out.append(CallFinished(call.index, done))

    def _fail(self) -> bool:
        """The undecided call at `mark` is none: its text is content (a block's through its
        closing tag)."""
        self.pos = self.mark
        self.state = "failed_block" if self.in_block else "text"
        self.in_array = False
        return True

    # -- the bare JSON forms (start of the output)

    def _lead(self, text: str, finished: bool) -> bool:
        j = skip_ws(text, self.pos)
        self._content(text[self.pos:j])
        self.pos = j
        rest = text[j:j + len(PYTHON_TAG)]
        if not rest:
            self.state = "end" if finished else "lead"
            return finished
        if self.bare and rest == PYTHON_TAG:
            self.mark, self.pos, self.state = j, j + len(PYTHON_TAG), "bare_open"
        elif self.bare and PYTHON_TAG.startswith(rest) and not finished:
            return False
        elif self.bare and rest[0] in "{[":
            self.mark, self.state = j, "bare_open"
        else:
            self.state = "text"
        return True

    def _bare_open(self, text: str, finished: bool) -> bool:
        k = skip_ws(text, self.pos)
        if k >= len(text):
            return self._fail() if finished else False
        if text[k] == "[" and not self.in_array:
            self.pos, self.in_array = k + 1, True
            return True
        if text[k] != "{":
            return self._fail()
        self.pos, self.state = k, "head"
        return True

    def _bare_sep(self, text: str, finished: bool) -> bool:
        """After a bare call: a separator and the next call, the array's end, or content."""
        k = skip_ws(text, self.pos)
        sep = "," if self.in_array else ";"
        separated = k < len(text) and text[k] == sep
        if separated:
            k = skip_ws(text, k + 1)
        elif self.in_array and k < len(text) and text[k] == "]":
            self.pos, self.in_array, self.state = k + 1, False, "text"
            return True
        if k >= len(text):
            if finished:  # a trailing separator belongs to the calls
                self.pos, self.state = k, "end"
            return finished
        if text[k] == "{" and (separated or not self.in_array):
            self.mark, self.pos, self.state = self.pos, k, "head"
            return True
        self.in_array, self.state = False, "text"
        return True

    # -- one call object (bare or in a block)

    def _read_head(self, text: str, finished: bool) -> bool:
        head = match_head(text, self.pos, self.names, finished)
        if head == MORE:
            return False
        if head == FAIL or not isinstance(head, Head):
            return self._fail()
        if head.kind == "none":
            self._begin(head.name, head.end)
            self._arguments("{}")
            self._end("{}")
            self.pos, self.state = head.end, "block_end" if self.in_block else "bare_sep"
        elif head.kind == "object":
            self._begin(head.name, head.end)
            self._span = JsonSpan(head.end, CLOSE_TAG if self.in_block else None)
            self.pos, self.state = head.end, "args"
        else:
            self._head, self.state = head, "string_args"
        return True

    def _read_args(self, text: str, finished: bool) -> bool:
        assert self._span is not None and self._call is not None
        span = self._span
        safe = span.advance(text, finished)
        self._arguments(text[self.pos:safe])
        self.pos = safe
        if not (span.done or finished):
            return False
        self._end(text[self._call.args_at:safe])
        self.state = "tail" if span.closed else "block_end" if span.cut else "end"
        return True

    def _string_args(self, text: str, finished: bool) -> bool:
        """Arguments as a JSON string: decided once the string closes (in a block, before
        `</tool_call>`) and holds a JSON object; sent in one fragment."""
        head = self._head
        assert head is not None
        limit = text.find(CLOSE_TAG, head.end) if self.in_block else -1
        end = match_string(text, head.end, len(text) if limit < 0 else limit)
        if end is None:
            return self._fail() if finished or limit >= 0 else False
        arguments = _object_text(text[head.end:end])
        if arguments is None:
            return self._fail()
        self._begin(head.name, head.end)
        self._arguments(arguments)
        self._end(arguments)
        self.pos, self.state = end, "tail"
        return True

    def _tail(self, text: str, finished: bool) -> bool:
        """After the arguments: the object's `}`, or more keys (skipped); else it ends here."""
        k = skip_ws(text, self.pos)
        if k >= len(text) and not finished:
            return False
        if k < len(text) and text[k] == "}":
            self.pos = k + 1
        elif k < len(text) and text[k] == ",":
            self._span = JsonSpan(k + 1, CLOSE_TAG if self.in_block else None, depth=1)
            self.pos, self.state = k + 1, "tail_span"
            return True
        self.state = "block_end" if self.in_block else "bare_sep"
        return True

    def _tail_span(self, text: str, finished: bool) -> bool:
        assert self._span is not None
        self.pos = self._span.advance(text, finished)
        if self._span.closed:
            self.state = "block_end" if self.in_block else "bare_sep"
        elif self._span.cut:
            self.state = "block_end"
        elif finished:
            self.state = "end"
        return self._span.done or finished

    # -- text and <tool_call> blocks

    def _text(self, text: str, finished: bool) -> bool:
        if not self.blocks:
            self._content(text[self.pos:])
            self.pos = len(text)
        else:
            k = text.find(OPEN_TAG, self.pos)
            if k >= 0:
                self._content(text[self.pos:k])
                self.mark, self.pos, self.in_block, self.state = k, k + len(OPEN_TAG), True, "block_open"
                return True
            held = 0 if finished else partial_stop_suffix_len(text, [OPEN_TAG])
            safe = max(self.pos, len(text) - held)
            self._content(text[self.pos:safe])
            self.pos = safe
        if finished:
            self.state = "end"
        return finished

    def _block_open(self, text: str, finished: bool) -> bool:
        k = skip_ws(text, self.pos)
        if k >= len(text):
            return self._fail() if finished else False
        if text[k] != "{":
            return self._fail()
        self.pos, self.state = k, "head"
        return True

    def _block_end(self, text: str, finished: bool) -> bool:
        """After a call in a block: whitespace and `</tool_call>` (dropped with the call), or,
        without the tag, the block ends after the call."""
        k = skip_ws(text, self.pos)
        rest = text[k:k + len(CLOSE_TAG)]
        if rest == CLOSE_TAG:
            self.pos = k + len(CLOSE_TAG)
        elif CLOSE_TAG.startswith(rest) and not finished:
            return False
        self.in_block, self.state = False, "text"
        return True

    def _failed_block(self, text: str, finished: bool) -> bool:
        start = max(self.mark + len(OPEN_TAG), self.pos - len(CLOSE_TAG) + 1)
        k = text.find(CLOSE_TAG, start)
        end = len(text) if k < 0 else k + len(CLOSE_TAG)
        self._content(text[self.pos:end])
        self.pos = end
        if k >= 0:
            self.in_block, self.state = False, "text"
            return True
        if finished:
            self.state = "end"
        return finished


def _object_text(literal: str) -> str | None:
    """The text of a JSON string literal when that text is a JSON object, else None."""
    try:
        text = orjson.loads(literal)
        return text if isinstance(text, str) and isinstance(orjson.loads(text), dict) else None
    except orjson.JSONDecodeError:
        return None


def _merged(events: list[ToolEvent]) -> list[ToolEvent]:
    """Consecutive content pieces, and fragments of one call, as one event."""
    out: list[ToolEvent] = []
    for e in events:
        last = out[-1] if out else None
        if isinstance(e, ContentDelta) and isinstance(last, ContentDelta):
            out[-1] = ContentDelta(last.text + e.text)
        elif isinstance(e, ArgumentsDelta) and isinstance(last, ArgumentsDelta) and last.index == e.index:
            out[-1] = ArgumentsDelta(e.index, last.text + e.text)
        else:
            out.append(e)
    return out
