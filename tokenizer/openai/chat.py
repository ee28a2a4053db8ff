"""/v1/chat/completions: the body parsed into the typed request, and the answer (a
`chat.completion`, or `chat.completion.chunk` deltas) folded from the event stream.

Choices where OpenAI or SGLang leave room:
  - `max_tokens` (or `max_completion_tokens`) defaults to the rest of the context (OpenAI, vLLM).
  - Constraints: `response_format` json_object is any JSON, json_schema its schema; a forced tool
    call (`tool_choice` required or named) is a grammar of the call; at most one constraint per
    request (with the `regex`, `json_schema`, `ebnf` extras too), else a 400 naming the field.
  - `chat_template_kwargs` carries template variables only; a request's own template
    (`chat_template`) needs a server started with --trust-request-chat-template.
  - A stream sends the role first, then per update: one chunk with the reasoning and content
    deltas and their logprobs, one chunk per tool-call delta (id, type and name, then argument
    fragments), and a last chunk with the finish_reason (tool_calls when it stopped after calls).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from runtime.contracts.config import ServerConfig
from runtime.contracts.errors import InvalidRequest
from runtime.contracts.json_text import client_json
from runtime.contracts.sampling import ANY_JSON, GRAMMAR_FIELDS
from tokenizer.core.chat_template import RequestTemplate, reserved_names
from tokenizer.core.events import (
    Finished,
    LogprobEntry,
    ReasoningDelta,
    TextDelta,
    Tokens,
    ToolArgsDelta,
    ToolCallDone,
    ToolCallStarted,
    TopLogprobs,
    Update,
    Usage,
)
from tokenizer.core.json_bounds import load_json_text
from tokenizer.core.reasoning import PARSERS as REASONING_PARSERS
from tokenizer.core.request import ChatInput, GenRequest, Logprobs, PromptRequest, ReadOptions
from tokenizer.core.spec import BRACKETS, parse
from tokenizer.core.tools import ToolPlan, function, openai_choice, tool_grammar, tool_plan
from tokenizer.openai.common import (
    ERROR_NAMES,
    Header,
    OpenAIAnswer,
    cache_namespace,
    include_usage,
    new_rid,
    sampling_fields,
)
from tokenizer.openai.spec import ChatBody, HistoryCall, Parts

_UNTRUSTED = ("is not accepted: this server renders its own chat template only (an operator can allow a "
              "request's template with --trust-request-chat-template)")


@dataclass(frozen=True, slots=True)
class ChatRequest:
    """A parsed chat body: the typed request and what its answer needs."""

    req: GenRequest
    header: Header
    logprobs: bool
    include_usage: bool


def parse_chat(raw: Any, config: ServerConfig, model: str, owner: str = "") -> ChatRequest:
    """A /v1/chat/completions body (InvalidRequest naming the field)."""
    body = parse(ChatBody, raw, BRACKETS)
    if body.stream_options is not None and not body.stream:
        raise InvalidRequest.field("stream_options", "is only allowed when stream is true")
    if body.top_logprobs and not body.logprobs:
        raise InvalidRequest.field("top_logprobs", "requires logprobs to be true")
    plan = _tools(body)
    grammar, grammar_name = _constraints(body, plan)
    variables, template = _template(body, config.trust_request_chat_template)
    messages = [_message(m, i) for i, m in enumerate(body.messages)]
    max_tokens = body.max_completion_tokens if body.max_completion_tokens is not None else body.max_tokens
    sampling = {**sampling_fields(body, max_tokens), **grammar}
    rid = new_rid(body)
    logprobs = Logprobs(bool(body.logprobs), -1, body.top_logprobs or 0, True)
    prompt = PromptRequest(ChatInput(messages, variables, plan, template), rid, sampling, logprobs, "messages")
    fmt = REASONING_PARSERS.get(config.reasoning_parser) if body.separate_reasoning is not False else None
    read = ReadOptions(fmt, body.stream_reasoning is not False, plan, config.tool_call_parser)
    names = {**ERROR_NAMES, "top_logprobs_num": "top_logprobs", "input_ids": "messages", "text": "messages",
             "json_schema": grammar_name}
    req = GenRequest([prompt], stream=bool(body.stream), timeout=body.timeout, priority=body.priority,
                     cache_namespace=cache_namespace(body), owner=owner, read=read, names=names,
                     default_max_tokens=max_tokens is None)
    return ChatRequest(req, Header.new("chatcmpl-", rid, model), bool(body.logprobs), include_usage(body))


def _tools(body: ChatBody) -> ToolPlan | None:
    functions = [function(t.function.name, t.function.description, t.function.parameters) for t in body.tools or []]
    choice = body.tool_choice
    named = choice.function.name if choice is not None and not isinstance(choice, str) else None
    mode = openai_choice(choice if isinstance(choice, str) else None, named, functions)
    return tool_plan(functions, mode, body.parallel_tool_calls is not False)


def _constraints(body: ChatBody, plan: ToolPlan | None) -> tuple[dict[str, str], str]:
    """(grammar fields, the field a grammar error names) of response_format and a forced call."""
    given = [g for g in GRAMMAR_FIELDS if getattr(body, g) is not None]
    fmt = body.response_format
    grammar: dict[str, str] = {}
    name = "json_schema"
    if fmt is not None and fmt.type != "text":
        if given:
            raise InvalidRequest.field("response_format", f"cannot be combined with {given[0]}: give one constraint")
        given = ["response_format"]
        if fmt.type == "json_object":
            grammar, name = {"json_schema": ANY_JSON}, "response_format"
        else:
            where = "response_format.json_schema.schema"
            grammar, name = {"json_schema": client_json(fmt.json_schema.schema_, where)}, where
    if plan is not None and plan.choice.forced:
        if given:
            raise InvalidRequest.field("tool_choice", f"a forced tool call (tool_choice {plan.choice.mode}) cannot be "
                                                      f"combined with {given[0]}: give one constraint")
        grammar, name = tool_grammar(plan), "tools"
    return grammar, name


def _template(body: ChatBody, trust: bool) -> tuple[dict[str, Any], RequestTemplate | None]:
    """(template variables, the request's own template or None)."""
    variables = dict(body.chat_template_kwargs or {})
    template = body.chat_template
    where = "chat_template"
    if "chat_template" in variables:
        if template is not None:
            raise InvalidRequest.field("chat_template_kwargs.chat_template", "give chat_template once")
        value, where = variables.pop("chat_template"), "chat_template_kwargs.chat_template"
        if value is not None and (not isinstance(value, str) or not value.strip()):
            raise InvalidRequest.field(where, "must be a non-empty string (a Jinja chat template)")
        template = value
    for key in variables:
        if key in reserved_names():
            raise InvalidRequest.field(f"chat_template_kwargs.{key}", "is a parameter of apply_chat_template, not "
                                                                      "a template variable")
    if template is None:
        return variables, None
    if not trust:
        raise InvalidRequest.field(where, _UNTRUSTED)
    return variables, RequestTemplate(template, where)


def _message(m: Any, i: int) -> dict[str, Any]:
    """A message in the plain form the template renders."""
    where = f"messages[{i}]"
    role = "system" if m.role == "developer" else m.role
    out: dict[str, Any] = {"role": role, "content": text_of(m.content)}
    if role == "assistant" and m.tool_calls:
        out["tool_calls"] = [_call(c, f"{where}.tool_calls[{j}]") for j, c in enumerate(m.tool_calls)]
    if role == "tool" and m.tool_call_id is not None:
        out["tool_call_id"] = m.tool_call_id
    return out


def text_of(content: str | Parts | None) -> str:
    """A message's content as text (text parts joined)."""
    if content is None:
        return ""
    return content if isinstance(content, str) else "".join(part.text for part in content)


def _call(call: HistoryCall, where: str) -> dict[str, Any]:
    arguments = call.function.arguments
    if isinstance(arguments, str):
        load_json_text(arguments, f"{where}.function.arguments")  # NOTE: checked; rendering parses it again
    return {"id": call.id or "", "type": "function", "function": {"name": call.function.name, "arguments": arguments}}


# ---------------------------------------------------------------- answers


@dataclass(slots=True)
class _Choice:
    content: list[str] = field(default_factory=list)
    reasoning: list[str] = field(default_factory=list)
    calls: list[dict[str, Any]] = field(default_factory=list)
    logprobs: list[dict[str, Any]] = field(default_factory=list)
    usage: Usage | None = None
    finished: Finished | None = None


class ChatAnswer(OpenAIAnswer):
    """The answer of one chat request, folded from its events (streamed or not)."""

    chunk_object = "chat.completion.chunk"

    def __init__(self, chat: ChatRequest) -> None:
        super().__init__(chat.header, chat.req, chat.include_usage)
        self.chat = chat
        self.reasoning = chat.req.read.reasoning is not None
        self.choices: list[_Choice] = [_Choice() for _ in range(chat.req.choices)]

    def start(self) -> list[Any]:
        """The first chunk of every choice carries the role (OpenAI's order)."""
        return [self._chunk(i, {"role": "assistant", "content": ""}) for i in range(len(self.choices))]

    def update(self, update: Update) -> list[Any]:
        i, choice = update.choice, self.choices[update.choice]
        delta: dict[str, Any] = {}
        chunks: list[Any] = []
        logprobs = None
        for event in update.events:
            if isinstance(event, ReasoningDelta):
                choice.reasoning.append(event.text)
                delta["reasoning_content"] = delta.get("reasoning_content", "") + event.text
            elif isinstance(event, TextDelta):
                choice.content.append(event.text)
                delta["content"] = delta.get("content", "") + event.text
            elif isinstance(event, ToolCallStarted):
                chunks.append(self._chunk(i, {"tool_calls": [{"index": event.call, "id": event.id, "type": "function",
                                                              "function": {"name": event.name, "arguments": ""}}]}))
            elif isinstance(event, ToolArgsDelta):
                chunks.append(self._chunk(i, {"tool_calls": [{"index": event.call,
                                                              "function": {"arguments": event.text}}]}))
            elif isinstance(event, ToolCallDone):
                choice.calls.append({"id": event.id, "type": "function",
                                     "function": {"name": event.name, "arguments": event.arguments}})
            elif isinstance(event, Tokens):
                choice.usage = event.usage
                if self.chat.logprobs:
                    logprobs = chat_logprobs(event.logprobs or [], event.top)
                    choice.logprobs += logprobs["content"]
            elif isinstance(event, Finished):
                choice.finished = event
        head = [self._chunk(i, delta, logprobs=logprobs)] if delta or (logprobs and logprobs["content"]) else []
        tail = [self._chunk(i, {}, self._reason(choice))] if choice.finished is not None else []
        return head + chunks + tail

    def _reason(self, choice: _Choice) -> str | None:
        """stop, length or abort; tool_calls when it stopped by itself after calls."""
        if choice.finished is None:
            return None
        reason = choice.finished.reason
        return "tool_calls" if reason == "stop" and choice.calls else reason

    def _chunk(self, i: int, delta: dict[str, Any], reason: str | None = None,
               logprobs: dict[str, Any] | None = None) -> dict[str, Any]:
        return {**self.header.of(self.chunk_object),
                "choices": [{"index": i, "delta": delta, "logprobs": logprobs, "finish_reason": reason}]}

    def final(self) -> dict[str, Any]:
        choices = [self._final_choice(i, c) for i, c in enumerate(self.choices)]
        return {**self.header.of("chat.completion"), "choices": choices, "usage": self.usage()}

    def _final_choice(self, i: int, choice: _Choice) -> dict[str, Any]:
        content: str | None = "".join(choice.content)
        message: dict[str, Any] = {"role": "assistant", "content": content}
        if choice.calls:
            message["content"] = content if content and content.strip() else None
            message["tool_calls"] = choice.calls
        if self.reasoning:
            message["reasoning_content"] = "".join(choice.reasoning) if choice.reasoning else None
        logprobs = {"content": choice.logprobs} if self.chat.logprobs else None
        matched = choice.finished.matched if choice.finished is not None else None
        return {"index": i, "message": message, "logprobs": logprobs, "finish_reason": self._reason(choice),
                "matched_stop": matched}


def chat_logprobs(entries: list[LogprobEntry], tops: TopLogprobs | None) -> dict[str, Any]:
    """Chat's `{"content": [{token, logprob, bytes, top_logprobs}]}`."""
    content = []
    for k, entry in enumerate(entries):
        item = _token(entry)
        pos = tops[k] if tops is not None and k < len(tops) else None
        item["top_logprobs"] = [_token(t) for t in pos or []]
        content.append(item)
    return {"content": content}


def _token(entry: LogprobEntry) -> dict[str, Any]:
    text = entry[2] or ""
    return {"token": text, "logprob": entry[0], "bytes": list(text.encode("utf-8"))}
