"""A /v1/messages or /v1/messages/count_tokens body, checked: the chat messages and tools the
template renders, and (for messages) the manager's sampling parameters.

    fields                 -> sampling_params
    max_tokens (required)  -> max_new_tokens (>= 1)
    stop_sequences         -> stop (a list of non-empty strings)
    temperature, top_p, top_k -> the same names (ranges: `SamplingParams.validate`)
    metadata {user_id}     -> checked and ignored
    thinking               -> only {"type": "disabled"}: no thinking blocks here
    cache_control          -> ignored: the radix cache reuses every shared prefix by itself
    service_tier, speed, inference_geo -> ignored (one tier, one speed, one place)

Unknown fields are a 400 naming them, as Anthropic answers ("Extra inputs are not permitted").
JSON null means "absent" for every optional field. The manager's own errors name its fields;
`translate` renames them to this API's (max_new_tokens -> max_tokens, stop -> stop_sequences,
input_ids -> messages, json_schema -> tools).
"""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass, field
from typing import Any

from runtime.contracts.errors import InvalidRequest
from tokenizer.anthropic.blocks import check_conversation, fail
from tokenizer.anthropic.tools import AnthropicTools, check_tools
from tokenizer.openai.json_bounds import Bounds, check_text, check_value, describe

IGNORED = {"cache_control", "speed"}  # accepted and unread (both routes)
COUNT_FIELDS = {"model", "messages", "system", "tools", "tool_choice", "thinking", *IGNORED}
MESSAGES_FIELDS = COUNT_FIELDS | {"max_tokens", "stop_sequences", "stream", "temperature", "top_p",
                                  "top_k", "metadata", "service_tier", "inference_geo"}
SAMPLING = {"temperature": "temperature", "top_p": "top_p", "top_k": "top_k"}
RENAMES = {"max_new_tokens": "max_tokens", "stop": "stop_sequences", "input_ids": "messages",
           "json_schema": "tools"}
METADATA_BOUNDS = Bounds(max_depth=2, max_string=512)


@dataclass(slots=True)
class Conversation:
    """What the chat template renders: messages in the chat pipeline's shape and the tools."""

    messages: list[dict[str, Any]]
    tools: AnthropicTools


@dataclass(slots=True)
class MessagesPlan:
    """A checked /v1/messages request: its conversation, sampling and what the answer needs."""

    conversation: Conversation
    sampling: dict[str, Any]
    stream: bool
    stop_sequences: list[str]
    rid: str = field(default_factory=lambda: uuid.uuid4().hex)

    @property
    def id(self) -> str:
        return "msg_" + self.rid


def _check_object(req: Any, allowed: set[str]) -> dict[str, Any]:
    if not isinstance(req, dict):
        raise InvalidRequest("the request body must be a JSON object")
    unknown = sorted(k for k in req if k not in allowed)
    if unknown:
        raise fail(unknown[0], "Extra inputs are not permitted (unknown field)")
    model = req.get("model")
    if not isinstance(model, str):
        raise fail("model", f"Field required: a string (any: the served model answers), got "
                            f"{describe(model)}")
    thinking = req.get("thinking")
    if thinking is not None and thinking != {"type": "disabled"}:
        raise fail("thinking", "extended thinking is not supported (only {'type': 'disabled'})")
    return req


def check_count(req: Any) -> Conversation:
    """A /v1/messages/count_tokens body."""
    req = _check_object(req, COUNT_FIELDS)
    return _conversation(req)


def check_messages(req: Any) -> MessagesPlan:
    """A /v1/messages body."""
    req = _check_object(req, MESSAGES_FIELDS)
    max_tokens = req.get("max_tokens")
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int):
        raise fail("max_tokens", f"Field required: an integer >= 1, got {describe(max_tokens)}")
    if max_tokens < 1:
        raise fail("max_tokens", f"must be >= 1, got {max_tokens}")
    stream = req.get("stream")
    if stream is not None and not isinstance(stream, bool):
        raise fail("stream", f"must be a boolean, got {describe(stream)}")
    _check_metadata(req.get("metadata"))
    conversation = _conversation(req)
    stops = _stop_sequences(req.get("stop_sequences"))
    sampling: dict[str, Any] = {"max_new_tokens": max_tokens, **conversation.tools.grammar}
    for name, target in SAMPLING.items():
        if req.get(name) is not None:
            check_value(req[name], name, Bounds(max_depth=2))  # a bounded value in its error
            sampling[target] = req[name]
    if stops:
        sampling["stop"] = stops
    return MessagesPlan(conversation, sampling, bool(stream), stops)


def _conversation(req: dict[str, Any]) -> Conversation:
    messages = check_conversation(req.get("system"), req.get("messages"))
    return Conversation(messages, check_tools(req.get("tools"), req.get("tool_choice")))


def _stop_sequences(stops: Any) -> list[str]:
    if stops is None:
        return []
    if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops):
        raise fail("stop_sequences", "must be a list of non-empty strings")
    for i, s in enumerate(stops):
        check_text(s, f"stop_sequences.{i}")
    return list(stops)


def _check_metadata(metadata: Any) -> None:
    """Anthropic's `metadata` is {user_id?: string}; it changes nothing here."""
    if metadata is None:
        return
    if not isinstance(metadata, dict):
        raise fail("metadata", f"must be an object, got {describe(metadata)}")
    unknown = sorted(set(metadata) - {"user_id"})
    if unknown:
        raise fail(f"metadata.{unknown[0]}", "unknown field")
    user = metadata.get("user_id")
    if user is not None and not isinstance(user, str):
        raise fail("metadata.user_id", f"must be a string, got {describe(user)}")
    check_value(metadata, "metadata", METADATA_BOUNDS)


def translate(exc: InvalidRequest) -> InvalidRequest:
    """A manager error with this API's field names."""
    if exc.param is None:
        return exc
    key = exc.param.removeprefix("sampling_params.")
    name = RENAMES.get(key, key)
    message = re.sub(rf"\b{re.escape(key)}\b", name, exc.message) if key in RENAMES else exc.message
    return InvalidRequest(message, param=name)
