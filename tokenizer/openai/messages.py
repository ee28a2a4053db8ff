"""Chat `messages` validation: what the chat template receives is plain, bounded data of the
expected types at every depth, so a bad message is a 400 naming its field, never a 500 while
rendering (a deep value in an error's repr, a lone surrogate in the tokenizer, a RecursionError
in a JSON parser); `json_bounds.py` says why each bound exists.

    messages = check_messages(req["messages"])

Each message becomes {role, content[, tool_calls][, tool_call_id]}: content parts are joined
(text only), `developer` is `system`, assistant `tool_calls` keep OpenAI's shape with their
`arguments` as the client sent them (a JSON string or an object). Other keys are dropped, after
a type check of the ones OpenAI defines (`name`).
"""

from __future__ import annotations

from typing import Any

from runtime.contracts.errors import InvalidRequest
from tokenizer.openai.json_bounds import check_text, check_value, describe, load_json_text

ROLES = ("system", "developer", "user", "assistant", "tool")


def check_messages(messages: Any) -> list[dict[str, Any]]:
    """Validated messages with text content; see the module docstring."""
    if not isinstance(messages, list) or not messages:
        raise InvalidRequest("messages must be a non-empty list of message objects",
                             param="messages")
    return [_message(m, f"messages[{i}]") for i, m in enumerate(messages)]


def _message(m: Any, where: str) -> dict[str, Any]:
    if not isinstance(m, dict):
        raise InvalidRequest(f"{where} must be an object, got {describe(m)}", param=where)
    role = m.get("role")
    if not isinstance(role, str) or role not in ROLES:
        raise InvalidRequest(f"{where}.role must be one of {sorted(ROLES)}, got {describe(role)}",
                             param=f"{where}.role")
    _optional_text(m, "name", where)
    item: dict[str, Any] = {"role": "system" if role == "developer" else role,
                            "content": _content(m.get("content"), role, where)}
    if role == "assistant" and m.get("tool_calls") is not None:
        calls = check_history_calls(m["tool_calls"], f"{where}.tool_calls")
        if calls:
            item["tool_calls"] = calls
    if role == "tool" and _optional_text(m, "tool_call_id", where) is not None:
        item["tool_call_id"] = m["tool_call_id"]
    return item


def _optional_text(obj: dict[str, Any], key: str, where: str) -> str | None:
    """`obj[key]`: absent, null or a valid string."""
    value = obj.get(key)
    if value is None:
        return None
    if not isinstance(value, str):
        raise InvalidRequest(f"{where}.{key} must be a string, got {describe(value)}",
                             param=f"{where}.{key}")
    check_text(value, f"{where}.{key}")
    return value


def _content(content: Any, role: str, where: str) -> str:
    if isinstance(content, str):
        check_text(content, f"{where}.content")
        return content
    if content is None and role == "assistant":
        return ""
    if not isinstance(content, list):
        raise InvalidRequest(f"{where}.content must be a string or a list of content parts",
                             param=f"{where}.content")
    texts = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind != "text" or not isinstance(part.get("text"), str):
            raise InvalidRequest(
                f"{where}.content[{j}] must be a text part ({{'type': 'text', 'text': str}}); "
                f"got type {describe(kind)} (only text is supported)", param=f"{where}.content")
        check_text(part["text"], f"{where}.content[{j}].text")
        texts.append(part["text"])
    return "".join(texts)


def check_history_calls(calls: Any, where: str) -> list[dict[str, Any]]:
    """An assistant message's `tool_calls` from the history, in OpenAI's shape; `arguments` may
    be a JSON string (OpenAI) or an object, within `json_bounds.DEFAULT` either way."""
    if not isinstance(calls, list):
        raise InvalidRequest(f"{where} must be a list of tool calls", param=where)
    return [_history_call(call, f"{where}[{i}]") for i, call in enumerate(calls)]


def _history_call(call: Any, where: str) -> dict[str, Any]:
    fn = call.get("function") if isinstance(call, dict) else None
    if not isinstance(fn, dict):
        raise InvalidRequest(f"{where} must be {{'id': str, 'type': 'function', 'function': "
                             "{'name': str, 'arguments': str}}", param=where)
    call_id = _optional_text(call, "id", where)
    if call.get("type") not in (None, "function"):
        raise InvalidRequest(f"{where}.type must be 'function', got {describe(call.get('type'))}",
                             param=f"{where}.type")
    name = _optional_text(fn, "name", f"{where}.function")
    if name is None:
        raise InvalidRequest(f"{where}.function.name must be a string",
                             param=f"{where}.function.name")
    arguments = fn.get("arguments", "{}")
    _check_arguments(arguments, f"{where}.function.arguments")
    return {"id": call_id or "", "type": "function",
            "function": {"name": name, "arguments": arguments}}


def _check_arguments(arguments: Any, param: str) -> None:
    if isinstance(arguments, str):
        load_json_text(arguments, param)  # NOTE: only checked here; rendering parses it again
    elif isinstance(arguments, dict):
        check_value(arguments, param)
    else:
        raise InvalidRequest(f"{param} must be a JSON string or an object, got "
                             f"{describe(arguments)}", param=param)
