"""/v1/responses request validation: a Responses body becomes a chat request (the fields
`tokenizer.openai.protocol.check_chat` takes) plus what the response object echoes.

    resp = check_response(body, has_reasoning_parser)
    chat = resp.chat_request(history_items)        # then the chat pipeline: check, render, plan

Mapping (OpenAI's Responses names -> chat's):
    input items (+ the previous response's history)  -> messages (`items.py`), instructions first
    tools [{type: function, name, description, parameters, strict}] -> [{type, function: {...}}]
    tool_choice {type: function, name}                -> {type: function, function: {name}}
    text.format {type: text | json_object | json_schema, name, schema, strict} -> response_format
    max_output_tokens                                 -> max_tokens
    temperature, top_p, cache_salt, extra_key, priority -> as given
Errors raised by the chat pipeline name chat's fields; `rename_error` maps them back to the
Responses body's (messages -> input, tools[0].function.name -> tools[0].name, ...).
Accepted and echoed only: metadata, user, store, include, truncation ("disabled" or "auto": the
server never truncates), service_tier, prompt_cache_key, safety_identifier. Unknown fields are a
400 naming them, as OpenAI answers.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from runtime.contracts.errors import InvalidRequest
from tokenizer.openai.json_bounds import Bounds, check_value, describe
from tokenizer.openai.protocol import cache_key
from tokenizer.openai.responses.items import check_input, to_messages
from tokenizer.openai.responses.tools import check_text_format, check_tool_choice, check_tools

PASSED = ("temperature", "top_p", "cache_salt", "extra_key", "priority", "parallel_tool_calls")  # as they are
ECHOED = ("user", "service_tier", "prompt_cache_key", "safety_identifier", "include")
FIELDS = {"model", "input", "instructions", "tools", "tool_choice", "parallel_tool_calls", "max_output_tokens",
          "text", "reasoning", "metadata", "store", "stream", "stream_options", "previous_response_id",
          "truncation", "background", *PASSED, *ECHOED}
BOUNDS = Bounds(max_depth=8)
EFFORTS = (None, "none", "minimal", "low", "medium", "high", "xhigh")
METADATA_PAIRS, METADATA_KEY_CHARS, METADATA_VALUE_CHARS = 16, 64, 512


@dataclass(slots=True)
class ResponseRequest:
    """A validated Responses request; `echo` holds the fields the response object repeats."""

    body: dict[str, Any]
    items: list[dict[str, Any]]
    tools: list[dict[str, Any]]
    stream: bool
    store: bool
    previous_response_id: str | None
    salt: str | None
    echo: dict[str, Any]

    def chat_request(self, history: list[dict[str, Any]]) -> dict[str, Any]:
        """The chat request over `history` (the previous response's conversation) + the new items."""
        body = self.body
        chat: dict[str, Any] = {k: body[k] for k in PASSED if body.get(k) is not None}
        chat["messages"] = to_messages(body.get("instructions"), history + self.items)
        chat["stream"] = self.stream
        if body.get("max_output_tokens") is not None:
            chat["max_tokens"] = body["max_output_tokens"]
        if self.tools:
            chat["tools"] = [{"type": "function", "function": {k: v for k, v in t.items() if k != "type"}}
                             for t in self.tools]
        if body.get("tool_choice") is not None:
            chat["tool_choice"] = check_tool_choice(body["tool_choice"])
        fmt = check_text_format(body.get("text"))
        if fmt is not None:
            chat["response_format"] = fmt
        return chat


def check_response(req: Any, reasoning_parser: bool) -> ResponseRequest:
    """Validate a /v1/responses body (everything but what the chat pipeline checks)."""
    if not isinstance(req, dict):
        raise InvalidRequest("the request body must be a JSON object")
    unknown = sorted(k for k in req if k not in FIELDS)
    if unknown:
        raise InvalidRequest(f"Unrecognized request argument(s): {', '.join(unknown)}", param=unknown[0])
    for name in ("model", "instructions", "previous_response_id", "user", "service_tier", "prompt_cache_key",
                 "safety_identifier"):
        _typed(req, name, str, "a string")
    for name in ("stream", "store", "parallel_tool_calls", "background"):
        _typed(req, name, bool, "a boolean")
    for name in ("temperature", "top_p", "max_output_tokens", "include", "priority"):
        check_value(req.get(name), name, BOUNDS)
    if req.get("background"):
        raise InvalidRequest("background responses are not supported", param="background")
    if req.get("truncation") not in (None, "auto", "disabled"):
        raise InvalidRequest("truncation must be 'auto' or 'disabled'", param="truncation")
    _check_stream_options(req)
    tools = check_tools(req.get("tools"))
    check_text_format(req.get("text"))  # NOTE: before the echo below reads it
    check_tool_choice(req.get("tool_choice"))
    reasoning = _reasoning(req.get("reasoning"), reasoning_parser)
    items = check_input(req.get("input"))
    stream, store = bool(req.get("stream")), req.get("store") is not False
    echo = {"instructions": req.get("instructions"), "max_output_tokens": req.get("max_output_tokens"),
            "metadata": _metadata(req.get("metadata")), "parallel_tool_calls": req.get("parallel_tool_calls", True),
            "previous_response_id": req.get("previous_response_id"), "reasoning": reasoning,
            "store": store, "temperature": req.get("temperature"), "top_p": req.get("top_p"),
            "text": {"format": (req.get("text") or {}).get("format") or {"type": "text"}},
            "tool_choice": req.get("tool_choice") or ("auto" if tools else "none"), "tools": tools,
            "truncation": req.get("truncation") or "disabled", "background": False,
            **{k: req.get(k) for k in ECHOED}}
    return ResponseRequest(req, items, tools, stream, store, req.get("previous_response_id"), cache_key(req), echo)


def _typed(req: dict[str, Any], name: str, kind: type, what: str) -> None:
    value = req.get(name)
    if value is not None and not isinstance(value, kind):
        raise InvalidRequest(f"{name} must be {what}, got {describe(value)}", param=name)
    if isinstance(value, str):
        check_value(value, name, BOUNDS)


def _check_stream_options(req: dict[str, Any]) -> None:
    options = req.get("stream_options")
    if options is None:
        return
    if not isinstance(options, dict) or any(k != "include_obfuscation" for k in options):
        raise InvalidRequest("stream_options may only hold include_obfuscation", param="stream_options")
    if not req.get("stream"):
        raise InvalidRequest("stream_options is only allowed when stream is true", param="stream_options")


def _reasoning(value: Any, parser: bool) -> dict[str, Any]:
    """{effort, summary}. NOTE: a reasoning effort needs a server that splits reasoning out
    (--reasoning-parser); without one it is a 400, as OpenAI answers for non-reasoning models."""
    if value is None:
        return {"effort": None, "summary": None}
    if not isinstance(value, dict) or any(k not in ("effort", "summary", "generate_summary") for k in value):
        raise InvalidRequest("reasoning must be an object {effort, summary}", param="reasoning")
    effort = value.get("effort")
    if effort not in EFFORTS:
        raise InvalidRequest(f"reasoning.effort must be one of {list(EFFORTS[1:])}, got {describe(effort)}",
                             param="reasoning.effort")
    if effort is not None and not parser:
        raise InvalidRequest("reasoning.effort needs a server started with --reasoning-parser",
                             param="reasoning.effort")
    summary = value.get("summary", value.get("generate_summary"))
    if summary not in (None, "auto", "concise", "detailed"):
        raise InvalidRequest(f"reasoning.summary must be auto, concise or detailed, got {describe(summary)}",
                             param="reasoning.summary")
    return {"effort": effort, "summary": summary}


def _metadata(value: Any) -> dict[str, str] | None:
    """OpenAI's bounds: at most 16 pairs, keys up to 64 characters, string values up to 512."""
    if value is None:
        return None
    if not isinstance(value, dict) or len(value) > METADATA_PAIRS:
        raise InvalidRequest(f"metadata must be an object of at most {METADATA_PAIRS} string pairs",
                             param="metadata")
    for key, text in value.items():
        if len(key) > METADATA_KEY_CHARS or not isinstance(text, str) or len(text) > METADATA_VALUE_CHARS:
            raise InvalidRequest(f"metadata values must be strings of at most {METADATA_VALUE_CHARS} characters "
                                 f"under keys of at most {METADATA_KEY_CHARS}", param=f"metadata.{key[:64]}")
        check_value(text, "metadata", BOUNDS)
        check_value(key, "metadata", BOUNDS)
    return dict(value)


_RENAMES = [(re.compile(r"^messages\b.*"), "input"), (re.compile(r"^tools\[(\d+)\]\.function\b"), r"tools[\1]"),
            (re.compile(r"^response_format\.json_schema\.(\w+)"), r"text.format.\1"),
            (re.compile(r"^response_format\b.*"), "text.format"), (re.compile(r"^max_tokens$"), "max_output_tokens")]


def rename_error(exc: InvalidRequest) -> InvalidRequest:
    """An error of the chat pipeline with its field named as the Responses body names it."""
    param = exc.param
    if param is None:
        return exc
    for pattern, repl in _RENAMES:
        param = pattern.sub(repl, param)
    message = exc.message.replace("max_tokens", "max_output_tokens")
    return InvalidRequest(message, param=param)
