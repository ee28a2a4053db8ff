"""Anthropic's Messages API: a body parsed into the typed request, and the message (or its event
stream) folded from the core's events.

Conversation -> the chat messages the template renders:
    user text blocks          -> {"role": "user", "content": text}
    user tool_result blocks   -> {"role": "tool", "content": text, "tool_call_id": id}, first
    assistant text blocks     -> {"role": "assistant", "content": text, "tool_calls": [...]}
    assistant tool_use blocks -> tool_calls whose `arguments` is the `input` object
Rules (a 400 naming the field, `messages.1.content.0...`): the first and the last message are
the user's (no assistant prefill), and a tool_result answers a tool_use of the assistant message
just before it. Text blocks are joined with a blank line.

Tools: tool_choice auto (default) parses outputs for calls; any forces a call of any tool; tool
a call of the named one; none drops the tools; `disable_parallel_tool_use` allows one call.

The stream: message_start, ping, per block content_block_start / _delta... / _stop (text deltas,
or a tool_use started with an empty input once its name is certain, then input_json_delta
fragments), message_delta (stop_reason, stop_sequence, usage), message_stop. stop_reason:
max_tokens when cut by it; tool_use when the output holds calls; stop_sequence when one of
`stop_sequences` ended it; end_turn at the model's end of turn; pause_turn when the server cut
it short (a deadline, an abort).

usage splits the prompt three ways: cache_read_input_tokens were served by the radix cache (it
reuses every shared prefix by itself), cache_creation_input_tokens were written by the request's
`cache_control` pin (`caching.py`; 0 without one, or when the scheduler refused the pin), and
input_tokens is the rest. With cache_control the `cache_creation` object splits the writes by
the pin's TTL, and message_start waits for the first output, which brings the scheduler's counts
(the client reads `cache_creation` from message_start alone).
"""

from __future__ import annotations

import dataclasses
import uuid
from dataclasses import dataclass, field
from typing import Any

import orjson

from runtime.contracts.config import ServerConfig
from runtime.contracts.errors import InvalidRequest
from tokenizer.anthropic.caching import TTL_S, Cut, cache_cut
from tokenizer.anthropic.errors import anthropic_error
from tokenizer.anthropic.spec import CountBody, Message, MessagesBody, TextBlock, ToolResultBlock, ToolUseBlock
from tokenizer.core.events import (
    Finished,
    TextDelta,
    Tokens,
    ToolArgsDelta,
    ToolCallDone,
    ToolCallStarted,
    Update,
    Usage,
)
from tokenizer.core.request import CachePin, ChatInput, GenRequest, PromptRequest, ReadOptions
from tokenizer.core.spec import DOTS, parse
from tokenizer.core.tools import ToolChoice, ToolPlan, function, tool_grammar, tool_plan

CHOICE_MODES = {"auto": "auto", "any": "required", "tool": "named", "none": "none"}
ERROR_NAMES = {"max_new_tokens": "max_tokens", "stop": "stop_sequences", "input_ids": "messages",
               "json_schema": "tools"}


@dataclass(frozen=True, slots=True)
class MessagesRequest:
    """A parsed body: the typed request, its id and what its answer needs."""

    req: GenRequest
    id: str
    model: str
    stop_sequences: list[str]
    cache_ttl_s: float = 0.0  # the cache_control pin's TTL (0: no breakpoint)


def parse_count(raw: Any) -> ChatInput:
    """A /v1/messages/count_tokens body: the conversation a create would render."""
    body = parse(CountBody, raw, DOTS)
    cache_cut(body)  # the same checks as a create
    return ChatInput(conversation(body), {}, _tools(body))


def parse_messages(raw: Any, config: ServerConfig, model: str, owner: str = "") -> MessagesRequest:
    """A /v1/messages body (InvalidRequest naming the field, as Anthropic names it)."""
    body = parse(MessagesBody, raw, DOTS)
    plan = _tools(body)
    sampling: dict[str, Any] = {"max_new_tokens": body.max_tokens, **tool_grammar(plan)}
    for name in ("temperature", "top_p", "top_k"):
        if getattr(body, name) is not None:
            sampling[name] = getattr(body, name)
    stops = list(body.stop_sequences or [])
    if stops:
        sampling["stop"] = stops
    rid = uuid.uuid4().hex
    cut = cache_cut(body)
    chat = ChatInput(conversation(body), {}, plan)
    pin = CachePin(cut.ttl_s, cut_chat(body, chat, cut)) if cut is not None else None
    prompt = PromptRequest(chat, rid, sampling, field="messages", pin=pin)
    read = ReadOptions(tools=plan, tool_parser=config.tool_call_parser, call_id_prefix="toolu_")
    req = GenRequest([prompt], stream=bool(body.stream), owner=owner, read=read, names=ERROR_NAMES)
    return MessagesRequest(req, "msg_" + rid, model, stops, pin.ttl_s if pin is not None else 0.0)


def _tools(body: CountBody) -> ToolPlan | None:
    functions = [function(t.name, t.description, t.input_schema) for t in body.tools or []]
    choice = body.tool_choice
    if choice is None:
        return tool_plan(functions, ToolChoice("auto"))
    if choice.type != "tool" and choice.name is not None:
        raise InvalidRequest.field("tool_choice.name", f"is only allowed with type 'tool', not {choice.type!r}")
    if choice.type == "tool" and choice.name is None:
        raise InvalidRequest.field("tool_choice.name", "names the tool to call (type 'tool')")
    mode = ToolChoice(CHOICE_MODES[choice.type], choice.name)
    choice_param = "tool_choice.name" if choice.type == "tool" else "tool_choice"
    return tool_plan(functions, mode, parallel=not choice.disable_parallel_tool_use, choice_param=choice_param)


def conversation(body: CountBody) -> list[dict[str, Any]]:
    """The chat messages of `system` and `messages` (see the module docstring)."""
    return _conversation(body.system, body.messages, whole=True)


def cut_chat(body: CountBody, chat: ChatInput, cut: Cut) -> ChatInput:
    """`chat` (the body's) cut right after the block that ends the pinned part (`caching.py`);
    `chat` itself when that is the last block. A tool's cut keeps the system prompt: templates
    render the tools inside the system message, often after its text."""
    if cut.section == "messages":
        message = body.messages[cut.item]
        content = message.content
        blocks = content if isinstance(content, list) else [TextBlock(type="text", text=content)]
        if cut.item == len(body.messages) - 1 and cut.block == len(blocks) - 1:
            return chat
        head = [*body.messages[:cut.item], message.model_copy(update={"content": blocks[:cut.block + 1]})]
        return dataclasses.replace(chat, messages=_conversation(body.system, head, whole=False))
    system = body.system
    if cut.section == "system" and isinstance(system, list):
        system = system[:cut.item + 1]
    tools = chat.tools
    if cut.section == "tools" and tools is not None:
        tools = dataclasses.replace(tools, functions=tools.functions[:cut.item + 1])
    return dataclasses.replace(chat, messages=_conversation(system, [], whole=False), tools=tools)


def _conversation(system: str | list[TextBlock] | None, messages: list[Message], whole: bool) -> list[dict[str, Any]]:
    """The chat messages; `whole`: the conversation a request ends with (its last message the
    user's), not a cut of it."""
    out: list[dict[str, Any]] = []
    if system is not None:
        text = system if isinstance(system, str) else "\n\n".join(b.text for b in system)
        out.append({"role": "system", "content": text})
    calls: set[str] = set()  # the tool_use ids of the assistant message just before
    last = len(messages) - 1 if whole else 0
    for i, m in enumerate(messages):
        where = f"messages.{i}"
        blocks = [TextBlock(type="text", text=m.content)] if isinstance(m.content, str) else list(m.content)
        if m.role == "assistant":
            if i in (0, last):
                raise InvalidRequest.field(f"{where}.role", f"the {'first' if i == 0 else 'last'} message must be a "
                                                            "user message (assistant prefill is not supported)")
            out.append(_assistant(blocks))
            calls = {b.id for b in blocks if isinstance(b, ToolUseBlock)}
        else:
            out += _user(blocks, f"{where}.content", calls)
            calls = set()
    return out


def _assistant(blocks: list[Any]) -> dict[str, Any]:
    text = "\n\n".join(b.text for b in blocks if isinstance(b, TextBlock))
    message: dict[str, Any] = {"role": "assistant", "content": text}
    uses = [b for b in blocks if isinstance(b, ToolUseBlock)]
    if uses:
        message["tool_calls"] = [{"id": b.id, "type": "function", "function": {"name": b.name, "arguments": b.input}}
                                 for b in uses]
    return message


def _user(blocks: list[Any], where: str, calls: set[str]) -> list[dict[str, Any]]:
    """Tool results first (as tool messages, in their order), then the text as one message."""
    out = []
    for j, b in enumerate(blocks):
        if isinstance(b, ToolResultBlock):
            if b.tool_use_id not in calls:
                raise InvalidRequest.field(f"{where}.{j}.tool_use_id", f"{b.tool_use_id[:64]!r} answers no tool_use "
                                                                       "block of the previous assistant message")
            content = b.content if isinstance(b.content, str) else "\n\n".join(t.text for t in b.content or [])
            # NOTE: the template has no field for a failed call; the model reads it in the text.
            out.append({"role": "tool", "content": f"Error: {content}" if b.is_error else content,
                        "tool_call_id": b.tool_use_id})
    texts = [b.text for b in blocks if isinstance(b, TextBlock)]
    if texts or not out:
        out.append({"role": "user", "content": "\n\n".join(texts)})
    return out


# ---------------------------------------------------------------- answers


@dataclass(slots=True)
class _Block:
    kind: str  # text | tool_use
    body: dict[str, Any]
    args: list[str] = field(default_factory=list)


class MessageAnswer:
    """The message of one request, and its event stream, folded from the core's events."""

    named, done = True, b""

    def __init__(self, parsed: MessagesRequest) -> None:
        self.parsed, self.stream = parsed, parsed.req.stream
        self.blocks: list[_Block] = []
        self.open = False  # the last block is still open
        self.usage = Usage(0, 0, 0)
        self.finished: Finished | None = None
        self.deferred = parsed.cache_ttl_s > 0  # message_start waits for the first update's usage

    def start(self) -> list[Any]:
        return [] if self.deferred else self._start()

    def _start(self) -> list[Any]:
        return [{"type": "message_start", "message": self._message([], None)}, {"type": "ping"}]

    def update(self, update: Update) -> list[Any]:
        events: list[Any] = []
        if self.deferred:
            self.deferred = False
            self.usage = next((e.usage for e in update.events if isinstance(e, Tokens)), self.usage)
            events += self._start()
        for event in update.events:
            if isinstance(event, TextDelta):
                if not (self.open and self.blocks[-1].kind == "text"):
                    events += self._begin("text", {"type": "text", "text": ""})
                self.blocks[-1].body["text"] += event.text
                events.append(self._delta({"type": "text_delta", "text": event.text}))
            elif isinstance(event, ToolCallStarted):
                events += self._begin("tool_use", {"type": "tool_use", "id": event.id, "name": event.name, "input": {}})
            elif isinstance(event, ToolArgsDelta):
                self.blocks[-1].args.append(event.text)
                events.append(self._delta({"type": "input_json_delta", "partial_json": event.text}))
            elif isinstance(event, ToolCallDone):
                events += self._close()
            elif isinstance(event, Tokens):
                self.usage = event.usage
            elif isinstance(event, Finished):
                self.finished = event
                events += self._finish()
        return events

    def _begin(self, kind: str, body: dict[str, Any]) -> list[Any]:
        events = self._close()
        self.blocks.append(_Block(kind, body))
        self.open = True
        return events + [{"type": "content_block_start", "index": len(self.blocks) - 1, "content_block": dict(body)}]

    def _delta(self, delta: dict[str, Any]) -> dict[str, Any]:
        return {"type": "content_block_delta", "index": len(self.blocks) - 1, "delta": delta}

    def _close(self) -> list[Any]:
        if not self.open:
            return []
        self.open = False
        return [{"type": "content_block_stop", "index": len(self.blocks) - 1}]

    def _finish(self) -> list[Any]:
        """Close the last block (an empty text block when nothing was said), then the stop."""
        events = self._begin("text", {"type": "text", "text": ""}) if not self.blocks else []
        reason, sequence = self._stop()
        return events + self._close() + [
            {"type": "message_delta", "delta": {"stop_reason": reason, "stop_sequence": sequence},
             "usage": usage(self.usage, self.parsed.cache_ttl_s)},
            {"type": "message_stop"}]

    def _stop(self) -> tuple[str, str | None]:
        detail = self.finished.detail if self.finished is not None else {"type": "abort"}
        kind, matched = detail.get("type"), detail.get("matched")
        if kind == "length":
            return "max_tokens", None
        if any(b.kind == "tool_use" for b in self.blocks):
            return "tool_use", None
        if kind == "stop" and isinstance(matched, str) and matched in self.parsed.stop_sequences:
            return "stop_sequence", matched
        return ("end_turn" if kind == "stop" else "pause_turn"), None

    def _message(self, content: list[dict[str, Any]], stop: tuple[str, str | None] | None) -> dict[str, Any]:
        return {"id": self.parsed.id, "type": "message", "role": "assistant", "model": self.parsed.model,
                "content": content, "stop_reason": stop[0] if stop else None,
                "stop_sequence": stop[1] if stop else None, "usage": usage(self.usage, self.parsed.cache_ttl_s)}

    def end(self) -> list[Any]:
        return []

    def final(self) -> dict[str, Any]:
        if self.finished is None:  # cut short before its end: pause_turn, never a 500
            self._finish()
        return self._message([_content(b) for b in self.blocks], self._stop())

    def error_events(self, status: int, message: str, param: str | None) -> list[Any]:
        return [anthropic_error(status, message, param)]


def _content(block: _Block) -> dict[str, Any]:
    """A block as the answer holds it: a tool_use's input parsed (left empty when it is not a
    JSON object, as when max_tokens cut it)."""
    if block.kind != "tool_use":
        return block.body
    try:
        value = orjson.loads("".join(block.args) or "{}")
    except orjson.JSONDecodeError:
        value = None
    return {**block.body, "input": value if isinstance(value, dict) else {}}


def usage(u: Usage, cache_ttl_s: float = 0.0) -> dict[str, Any]:
    """Anthropic's usage (see the module docstring); `cache_ttl_s`: the pin's TTL, 0 for none."""
    out: dict[str, Any] = {
        "input_tokens": max(0, u.prompt_tokens - u.cached_tokens - u.pinned_tokens),
        "output_tokens": u.completion_tokens, "cache_creation_input_tokens": u.pinned_tokens,
        "cache_read_input_tokens": u.cached_tokens}
    if cache_ttl_s:
        long = cache_ttl_s >= TTL_S["1h"]
        out["cache_creation"] = {"ephemeral_5m_input_tokens": 0 if long else u.pinned_tokens,
                                 "ephemeral_1h_input_tokens": u.pinned_tokens if long else 0}
    return out
