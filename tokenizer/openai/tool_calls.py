"""OpenAI tool calls on top of plain text generation: prompts and parsing (pure: no tokenizer,
no I/O). Request validation and forced-call schemas live in `constraints.py`.

Prompt side: `adapt_to_template` passes `tools` and tool messages to a template whose source
uses them; for one that knows nothing about tools (SmolLM2's ChatML) `with_tool_prompt` adds a
Hermes-style system instruction listing the tools, and `messages_as_text` turns assistant
`tool_calls` and `role: "tool"` messages into text, so a conversation can continue after a call.

Output side: `parse_tool_calls` finds the calls in a finished output and `ToolCallStream` splits a
streamed output into content that can be sent at once and calls that are sent at the end.
Parsing rules (`--tool-call-parser`; SGLang's names):
  - hermes / qwen25 (Hermes and Qwen2.5/Qwen3's format): every `<tool_call>JSON</tool_call>`
    block (the closing tag may be missing at the very end) whose JSON is `{"name": <known tool>,
    "arguments": {...}}` becomes a call and leaves the content; a block that does not parse
    stays in the content as text.
  - llama3 (Llama 3.x's JSON tool calls): an output that is as a whole one or more such JSON
    objects, separated by `;` and optionally after `<|python_tag|>`, is that many calls (this is
    also the shape a forced call's grammar produces).
  - auto (the default): the hermes rule; when it finds no call, the llama3 rule.
  Otherwise the output is plain content. `arguments` may also be given as `parameters` (Llama
  3.1's name) or as a JSON string.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

import orjson

from runtime.contracts.json_text import client_json
from runtime.contracts.stop import partial_stop_suffix_len

OPEN_TAG, CLOSE_TAG = "<tool_call>", "</tool_call>"
PYTHON_TAG = "<|python_tag|>"
PARSERS = ("auto", "hermes", "qwen25", "llama3")
_BLOCK = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|\Z)", re.DOTALL)
TOOL_PROMPT = (
    "You can call functions. To call one, reply with a JSON object naming the function and giving "
    "its arguments, inside <tool_call></tool_call> tags:\n"
    '<tool_call>\n{"name": "<function name>", "arguments": {<arguments>}}\n</tool_call>\n'
    "You may make several calls, one block each. If no function is needed, answer normally.\n"
    "The functions:\n"
)


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
    """An output split into content (None when only calls remain) and calls."""

    content: str | None
    calls: list[ToolCall]


# ---------------------------------------------------------------- prompts


def with_tool_prompt(messages: list[dict[str, Any]],
                     functions: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The messages with the tool instruction added to the system message (or a new first one)."""
    listing = "\n".join(client_json(f, "tools", ensure_ascii=False) for f in functions)
    prompt = TOOL_PROMPT + listing
    if messages and messages[0]["role"] == "system":
        first = {**messages[0], "content": f"{messages[0]['content']}\n\n{prompt}"}
        return [first, *messages[1:]]
    return [{"role": "system", "content": prompt}, *messages]


def messages_as_text(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Assistant tool calls as `<tool_call>` text and tool results as user messages holding
    `<tool_response>` blocks (consecutive results in one message, as Qwen2.5's template does)."""
    out: list[dict[str, Any]] = []
    after_tool = False
    for m in messages:
        if m["role"] == "tool":
            block = f"<tool_response>\n{m['content']}\n</tool_response>"
            if after_tool:
                out[-1] = {"role": "user", "content": out[-1]["content"] + "\n" + block}
            else:
                out.append({"role": "user", "content": block})
        elif m["role"] == "assistant" and m.get("tool_calls"):
            blocks = [f"{OPEN_TAG}\n{_call_text(c)}\n{CLOSE_TAG}" for c in m["tool_calls"]]
            text = "\n".join([m["content"], *blocks] if m["content"] else blocks)
            out.append({"role": "assistant", "content": text})
        else:
            out.append({"role": m["role"], "content": m["content"]})
        after_tool = m["role"] == "tool"
    return out


def adapt_to_template(template: str, messages: list[dict[str, Any]],
                      kwargs: dict[str, Any]) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Tools and tool messages in the form the template takes: natively when its source uses
    `tools` / `tool_calls`, else as text (a system instruction; `<tool_call>` blocks)."""
    tools = kwargs.get("tools")
    if tools and "tools" not in template:
        kwargs = {k: v for k, v in kwargs.items() if k != "tools"}
        functions = [t["function"] for t in tools if isinstance(t, dict) and "function" in t]
        messages = with_tool_prompt(messages, functions)
    if any(m.get("tool_calls") or m["role"] == "tool" for m in messages):
        native = "tool_calls" in template
        messages = messages_for_template(messages) if native else messages_as_text(messages)
    return messages, kwargs


def messages_for_template(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Messages for a template that renders tool calls itself: `arguments` as objects, which
    is what HF templates expect (they apply `tojson` to them)."""
    out = []
    for m in messages:
        if m.get("tool_calls"):
            calls = [{**c, "function": {**c["function"], "arguments": _arguments(c)}}
                     for c in m["tool_calls"]]
            m = {**m, "tool_calls": calls}
        out.append(m)
    return out


def _call_text(call: dict[str, Any]) -> str:
    return client_json({"name": call["function"]["name"], "arguments": _arguments(call)}, "messages",
                       ensure_ascii=False)


def _arguments(call: dict[str, Any]) -> Any:
    """A history call's arguments as an object when they are JSON text. NOTE: orjson, which
    cannot recurse too deep nor yield a lone surrogate (the request check refused JSON that only
    the stdlib parser reads: `json_bounds.load_json_text`)."""
    args = call["function"]["arguments"]
    if isinstance(args, str):
        try:
            return orjson.loads(args)
        except orjson.JSONDecodeError:
            pass  # NOTE: kept as the client sent it: the history is rendered, not judged
    return args


# ---------------------------------------------------------------- parsing


def new_call_id() -> str:
    return "call_" + uuid.uuid4().hex[:24]


def parse_tool_calls(text: str, names: Collection[str], parser: str = "auto") -> ParsedOutput:
    """Calls of known tools in a finished output; see the module docstring for the rules."""
    if parser != "llama3":
        calls, pieces, pos = [], [], 0
        for m in _BLOCK.finditer(text):
            call = _as_call(m.group(1), names)
            if call is not None:
                pieces.append(text[pos:m.start()])
                pos = m.end()
                calls.append(call)
        if calls:
            content = "".join(pieces) + text[pos:]
            return ParsedOutput(content if content.strip() else None, calls)
        if parser != "auto":
            return ParsedOutput(text, [])
    json_calls = _json_calls(text, names)
    return ParsedOutput(None, json_calls) if json_calls else ParsedOutput(text, [])


def _json_calls(text: str, names: Collection[str]) -> list[ToolCall]:
    """Llama 3's form: the whole output one or more call objects, `;`-separated ([] otherwise)."""
    rest = text.strip().removeprefix(PYTHON_TAG).lstrip()
    decoder, calls = json.JSONDecoder(), []
    while rest:
        try:
            obj, end = decoder.raw_decode(rest)
        except (ValueError, RecursionError):  # NOTE: a constrained output can nest 1000 deep
            return []
        call = _call_of(obj, names)
        if call is None:
            return []
        calls.append(call)
        rest = rest[end:].lstrip()
        if rest.startswith(";"):
            rest = rest[1:].lstrip()
    return calls


def _as_call(text: str, names: Collection[str]) -> ToolCall | None:
    if not text.startswith("{"):
        return None
    try:
        obj = orjson.loads(text)
    except orjson.JSONDecodeError:
        return None
    return _call_of(obj, names)


def _call_of(obj: Any, names: Collection[str]) -> ToolCall | None:
    """The call a parsed JSON value makes, or None. NOTE: an output is model text that a client
    can steer (a regex constraint): arguments too deep to write back, or holding a lone surrogate
    (which no JSON response can carry), make it content, not a call."""
    name = obj.get("name") if isinstance(obj, dict) else None
    if not isinstance(name, str) or name not in names:
        return None
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):
        try:
            args = orjson.loads(args)
        except orjson.JSONDecodeError:
            return None
    if not isinstance(args, dict):
        return None
    try:
        text = json.dumps(args, ensure_ascii=False)
        text.encode("utf-8")
    except (RecursionError, ValueError):  # UnicodeEncodeError is a ValueError
        return None
    return ToolCall(name, text, new_call_id())


class ToolCallStream:
    """One streamed choice: content is sent as soon as it cannot be part of a call; what may be
    a call is held and parsed when the output finishes.

    Held: everything in forced mode; in auto mode an output that is blank so far or starts with
    `{` (it may be a bare call), and everything from the first `<tool_call>` (or a partial tag at
    the end). NOTE: what `feed` returns joins to `parse_tool_calls(text).content`.
    """

    def __init__(self, names: Collection[str], forced: bool, parser: str = "auto") -> None:
        self.names, self.forced, self.parser = names, forced, parser
        self.sent = 0

    def feed(self, text: str, finished: bool) -> tuple[str, list[ToolCall]]:
        """(content to send now, calls: only once finished) for the cumulative `text`."""
        if finished:
            return self._finish(text)
        safe = self._safe_len(text)
        delta = text[self.sent:safe]
        self.sent = max(self.sent, safe)
        return delta, []

    def _safe_len(self, text: str) -> int:
        head = text.lstrip()
        json_form = self.parser in ("auto", "llama3")
        if self.forced or not head or (json_form and (head.startswith("{") or PYTHON_TAG.startswith(head[:14]))):
            return 0
        if self.parser == "llama3":
            return len(text)
        start = text.find(OPEN_TAG)
        return start if start >= 0 else len(text) - partial_stop_suffix_len(text, [OPEN_TAG])

    def _finish(self, text: str) -> tuple[str, list[ToolCall]]:
        parsed = parse_tool_calls(text, self.names, "auto" if self.forced else self.parser)
        content = text if not parsed.calls else parsed.content or ""
        delta = content[self.sent:]
        self.sent = len(text)
        return delta, parsed.calls


def tool_call_deltas(calls: list[ToolCall]) -> list[dict[str, Any]]:
    """Stream deltas for calls, as OpenAI sends them: id, type and name first, then arguments
    (the `openai` client concatenates `arguments` fragments by `index`)."""
    deltas = []
    for index, call in enumerate(calls):
        head = {"index": index, "id": call.id, "type": "function",
                "function": {"name": call.name, "arguments": ""}}
        deltas.append({"tool_calls": [head]})
        deltas.append({"tool_calls": [{"index": index, "function": {"arguments": call.arguments}}]})
    return deltas
