"""The Messages API's schemas in the OpenAPI document (`tokenizer/openapi.py`), built from the
validators' tables (`request.py`, `blocks.py`, `tools.py`) so that the fuzzer's bodies are the
ones those accept: closed objects, null for "absent" on optional fields. Rules across fields
(role order, tool_result ids, prompt + max_tokens within the context) are described, not encoded.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from runtime.contracts.sampling import MAX_STOP_STR_CHARS, MAX_STOP_STRS
from tokenizer.anthropic import blocks, request, tools
from tokenizer.openapi_bodies import (
    BOOL,
    IGNORED_FIELD,
    Schema,
    array,
    obj,
    ref,
    sampling_properties,
    string,
)

if TYPE_CHECKING:
    from tokenizer.openapi_bodies import SchemaLimits

STR: Schema = {"type": "string"}
INT: Schema = {"type": "integer"}
ANY_OBJECT: Schema = {"type": "object"}
NULL_STR: Schema = {"type": ["string", "null"]}


def _block(kind: str, props: dict[str, Schema], required: tuple[str, ...]) -> Schema:
    extra = {"cache_control": ANY_OBJECT, "citations": {"type": "array"}}
    allowed = {k: v for k, v in {**extra, **props}.items() if k in blocks.BLOCK_KEYS[kind]}
    return obj({"type": {"const": kind}, **allowed}, ("type", *required), closed=True)


def _blocks() -> dict[str, Schema]:
    text = _block("text", {"text": string()}, ("text",))
    result_content = {"anyOf": [string(), array(ref("AnthropicTextBlock"))]}
    return {
        "AnthropicTextBlock": text,
        "AnthropicToolUseBlock": _block("tool_use", {"id": string(), "name": string(),
                                                     "input": ANY_OBJECT}, ("id", "name", "input")),
        "AnthropicToolResultBlock": _block("tool_result", {"tool_use_id": string(), "content":
                                                           result_content, "is_error": BOOL},
                                           ("tool_use_id",)),
    }


def _message(role: str) -> Schema:
    names = {"text": "AnthropicTextBlock", "tool_use": "AnthropicToolUseBlock",
             "tool_result": "AnthropicToolResultBlock"}
    parts = [ref(names[k]) for k in blocks.ROLE_BLOCKS[role]]
    content = {"anyOf": [string(), array({"anyOf": parts})]}
    return obj({"role": {"const": role}, "content": content}, ("role", "content"), closed=True)


def _tool() -> Schema:
    schema = obj({"type": {"const": "object"}}, ("type",))
    props = {"name": {"type": "string", "pattern": f"^{tools.NAME.pattern}$"},
             "description": string(), "input_schema": schema, "type": {"const": "custom"},
             "cache_control": ANY_OBJECT}
    return obj(props, ("name", "input_schema"), closed=True)


def _tool_choice() -> Schema:
    parallel = {"disable_parallel_tool_use": BOOL}
    plain = obj({"type": {"type": "string", "enum": ["auto", "any", "none"]}, **parallel},
                ("type",), closed=True)
    named = obj({"type": {"const": "tool"}, "name": string(), **parallel}, ("type", "name"),
                closed=True)
    return {"anyOf": [plain, named], "description": "any / tool need tools; a named tool must be in tools"}


def _count_props() -> dict[str, Schema]:
    messages = {**array({"anyOf": [_message("user"), _message("assistant")]}, 1),
                "prefixItems": [_message("user")]}
    return {"model": {"type": "string", "description": "any: the served model answers"},
            "messages": {**messages, "description": "the first and last are the user's; a "
                         "tool_result answers a tool_use of the message before"},
            "system": {"anyOf": [string(), array(ref("AnthropicTextBlock"))]},
            "tools": array(_tool()), "tool_choice": _tool_choice(),
            "thinking": obj({"type": {"const": "disabled"}}, ("type",), closed=True),
            **{name: IGNORED_FIELD for name in request.IGNORED}}


def request_schemas(lim: SchemaLimits) -> dict[str, Schema]:
    """The two request bodies and their blocks."""
    count, sampling = _count_props(), sampling_properties(lim)
    props = {**count, "max_tokens": {**sampling["max_new_tokens"], "minimum": 1},
             "stop_sequences": array(string(1, MAX_STOP_STR_CHARS), 0, MAX_STOP_STRS),
             "stream": BOOL, **{name: sampling[target] for name, target in request.SAMPLING.items()},
             "metadata": obj({"user_id": string(0, request.METADATA_BOUNDS.max_string)}, closed=True),
             "service_tier": IGNORED_FIELD, "inference_geo": IGNORED_FIELD}
    assert set(props) == request.MESSAGES_FIELDS and set(count) == request.COUNT_FIELDS
    return {"MessagesRequest": obj(props, ("model", "messages", "max_tokens"), closed=True),
            "CountTokensRequest": obj(count, ("model", "messages"), closed=True), **_blocks()}


def response_schemas() -> dict[str, Schema]:
    """The message, the token count and the error object."""
    usage = obj({"input_tokens": INT, "output_tokens": INT, "cache_creation_input_tokens": INT,
                 "cache_read_input_tokens": INT}, ("input_tokens", "output_tokens"), not_null=True)
    block = obj({"type": {"type": "string", "enum": ["text", "tool_use"]}}, ("type",))
    message = obj({"id": STR, "type": {"const": "message"}, "role": {"const": "assistant"},
                   "model": STR, "content": array(block), "stop_reason": NULL_STR,
                   "stop_sequence": NULL_STR, "usage": usage},
                  ("id", "type", "role", "model", "content", "stop_reason", "usage"), not_null=True)
    error = obj({"type": STR, "message": STR}, ("type", "message"), not_null=True)
    return {"AnthropicMessage": message,
            "MessageTokensCount": obj({"input_tokens": INT}, ("input_tokens",), not_null=True),
            "AnthropicError": obj({"type": {"const": "error"}, "error": error}, ("type", "error"),
                                  not_null=True)}
