"""The OpenAPI schemas of /v1/responses (`tokenizer/openapi.py` puts them in the document), from
the validators' own tables: the body's fields are `protocol.FIELDS`, items and tools the keys
`items.py` and `tools.py` accept, sampling bounds the server's (`openapi_bodies`).
"""

from __future__ import annotations

from typing import Any

from tokenizer.generate_body import MAX_CACHE_KEY_CHARS
from tokenizer.openai.responses import items, protocol
from tokenizer.openapi_bodies import (
    BOOL,
    INT32_MAX,
    TOOL_NAME_PATTERN,
    Schema,
    SchemaLimits,
    array,
    integer,
    obj,
    sampling_properties,
    string,
)

STR: Schema = {"type": "string"}
ANY_LIST: Schema = {"type": "array"}


def _enum(*values: Any) -> Schema:
    return {"enum": list(values)}


def _items() -> Schema:
    """One `input` item (`items.py`): closed objects, their `type` never null."""
    part = obj({"type": _enum(*items.TEXT_PARTS), "text": STR, "annotations": ANY_LIST, "logprobs": ANY_LIST},
               ("type", "text"), closed=True)
    text = {"anyOf": [STR, array(part)]}
    loose = {"id": STR, "status": STR}
    message = obj({"type": {"const": "message"}, "role": _enum(*items.ROLES), "content": text, "phase": STR,
                   **loose}, ("role", "content"), closed=True, not_null=("type",))
    call = obj({"type": {"const": "function_call"}, "call_id": STR, "name": STR, "arguments": STR,
                "namespace": STR, "caller": {"type": "object"}, "async": BOOL, **loose},
               ("type", "call_id", "name", "arguments"), closed=True)
    result = obj({"type": {"const": "function_call_output"}, "call_id": STR, "output": text, **loose},
                 ("type", "call_id", "output"), closed=True)
    reasoning = obj({"type": {"const": "reasoning"}, "summary": ANY_LIST, "content": ANY_LIST,
                     "encrypted_content": STR, **loose}, ("type",), closed=True)
    return {"anyOf": [message, call, result, reasoning]}


def tool_schema() -> Schema:
    """A function tool (`tools.TOOL_KEYS`)."""
    return obj({"type": {"const": "function"}, "name": {"type": "string", "pattern": TOOL_NAME_PATTERN},
                "description": STR, "parameters": obj({"type": {"const": "object"}}, not_null=True), "strict": BOOL,
                "defer_loading": {"const": False}, "output_schema": {"type": "object"}},
               ("type", "name"), closed=True)


def _text() -> Schema:
    plain = obj({"type": _enum("text", "json_object")}, ("type",), closed=True)
    spec = obj({"type": {"const": "json_schema"}, "name": STR, "schema": {"type": "object"}, "strict": BOOL,
                "description": STR}, ("type", "schema"), closed=True)
    return obj({"format": {"anyOf": [plain, spec]}, "verbosity": _enum("low", "medium", "high")}, closed=True)


def request_schemas(lim: SchemaLimits) -> dict[str, Schema]:
    """The body of POST /v1/responses."""
    sampling = sampling_properties(lim)
    choice = obj({"type": {"const": "function"}, "name": STR}, ("type", "name"), closed=True)
    props: dict[str, Schema] = {
        "model": {"type": "string", "description": "ignored: the one served model answers"},
        "input": {"anyOf": [STR, array(_items())]}, "instructions": STR, "tools": array(tool_schema()),
        "tool_choice": {"anyOf": [_enum("none", "auto", "required"), choice]}, "parallel_tool_calls": BOOL,
        "max_output_tokens": sampling["max_new_tokens"], "temperature": sampling["temperature"],
        "top_p": sampling["top_p"], "text": _text(),
        "reasoning": {**obj({"effort": _enum(*protocol.EFFORTS[1:]), "summary": _enum("auto", "concise", "detailed"),
                             "generate_summary": _enum("auto", "concise", "detailed")}, closed=True),
                      "description": "an effort needs --reasoning-parser"},
        "metadata": {"type": "object", "maxProperties": protocol.METADATA_PAIRS,
                     "propertyNames": {"maxLength": protocol.METADATA_KEY_CHARS},
                     "additionalProperties": string(0, protocol.METADATA_VALUE_CHARS)},
        "store": BOOL, "stream": BOOL, "stream_options": obj({"include_obfuscation": BOOL}, closed=True),
        "previous_response_id": STR, "truncation": _enum("auto", "disabled"), "background": {"const": False},
        "include": array(STR), "user": STR, "service_tier": STR, "prompt_cache_key": STR, "safety_identifier": STR,
        "cache_salt": string(1, MAX_CACHE_KEY_CHARS), "extra_key": string(1, MAX_CACHE_KEY_CHARS),
        "priority": {**integer(-INT32_MAX, INT32_MAX), "description": "needs --enable-priority-scheduling"},
    }
    return {"ResponseRequest": obj(props, ("input",), closed=True)}


def response_schemas() -> dict[str, Schema]:
    """The answers: a response object, and DELETE's confirmation."""
    response = obj({"id": STR, "object": {"const": "response"}, "created_at": {"type": "integer"}, "status": STR,
                    "model": STR, "output": array({"type": "object"}), "usage": {"type": ["object", "null"]}},
                   ("id", "object", "status", "output"), not_null=True)
    deleted = obj({"id": STR, "object": {"const": "response.deleted"}, "deleted": BOOL},
                  ("id", "object", "deleted"), not_null=True)
    return {"Response": response, "ResponseDeleted": deleted}
