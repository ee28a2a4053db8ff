"""Responses `input` items: validated into a plain form (what the store keeps as history), and
turned into chat messages for the chat template (pure).

    input "Hi"                                        -> [message user "Hi"]
    {"role", "content": str | [input_text | output_text parts]}          (type "message" optional)
    {"type": "function_call", "call_id", "name", "arguments": JSON text}  -> assistant tool_calls
    {"type": "function_call_output", "call_id", "output": str | [input_text parts]}  -> tool message
    {"type": "reasoning", ...}                        -> accepted, not rendered (the model's own
                                                         thinking is not fed back, as OpenAI does
                                                         for models without encrypted reasoning)

The plain form: {"type": "message", "role", "content": text}, {"type": "function_call",
"call_id", "name", "arguments"}, {"type": "function_call_output", "call_id", "output"}. Keys an
item may carry (the ones OpenAI's client and the Agents SDK send back: ids, statuses,
annotations) are accepted; any other key is a 400 naming it, as OpenAI answers.
"""

from __future__ import annotations

from typing import Any

from runtime.contracts.errors import InvalidRequest
from tokenizer.openai.json_bounds import check_text, describe, load_json_text

ROLES = ("user", "assistant", "system", "developer")
ITEM_KEYS = {
    "message": {"type", "role", "content", "id", "status", "phase"},
    "function_call": {"type", "call_id", "name", "arguments", "id", "status", "namespace", "caller", "async"},
    "function_call_output": {"type", "call_id", "output", "id", "status"},
    "reasoning": {"type", "id", "summary", "content", "encrypted_content", "status"},
}
PART_KEYS = {"type", "text", "annotations", "logprobs"}
TEXT_PARTS = ("input_text", "output_text")


def check_input(value: Any) -> list[dict[str, Any]]:
    """`input` in the plain form (reasoning items dropped); see the module docstring."""
    if isinstance(value, str):
        check_text(value, "input")
        return [{"type": "message", "role": "user", "content": value}]
    if not isinstance(value, list):
        raise InvalidRequest(f"input must be a string or a list of items, got {describe(value)}", param="input")
    items = [_item(item, f"input[{i}]") for i, item in enumerate(value)]
    return [item for item in items if item is not None]


def _item(item: Any, where: str) -> dict[str, Any] | None:
    if not isinstance(item, dict):
        raise InvalidRequest(f"{where} must be an object, got {describe(item)}", param=where)
    kind = item.get("type", "message")
    if kind not in ITEM_KEYS:
        raise InvalidRequest(f"{where}.type must be one of {sorted(ITEM_KEYS)} (item_reference and other "
                             f"item types are not supported), got {describe(kind)}", param=f"{where}.type")
    unknown = sorted(k for k in item if k not in ITEM_KEYS[kind])
    if unknown:
        raise InvalidRequest(f"{where}: unknown {kind} field {describe(unknown[0])}", param=f"{where}.{unknown[0]}")
    if kind == "message":
        role = item.get("role")
        if role not in ROLES:
            raise InvalidRequest(f"{where}.role must be one of {list(ROLES)}, got {describe(role)}",
                                 param=f"{where}.role")
        return {"type": "message", "role": role, "content": _text(item.get("content"), f"{where}.content")}
    if kind == "function_call":
        arguments = _string(item, "arguments", where)
        load_json_text(arguments, f"{where}.arguments")  # NOTE: only checked; rendering parses it again
        return {"type": kind, "call_id": _string(item, "call_id", where), "name": _string(item, "name", where),
                "arguments": arguments}
    if kind == "function_call_output":
        return {"type": kind, "call_id": _string(item, "call_id", where),
                "output": _text(item.get("output"), f"{where}.output")}
    return None  # reasoning


def _string(item: dict[str, Any], key: str, where: str) -> str:
    value = item.get(key)
    if not isinstance(value, str):
        raise InvalidRequest(f"{where}.{key} must be a string, got {describe(value)}", param=f"{where}.{key}")
    check_text(value, f"{where}.{key}")
    return value


def _text(content: Any, where: str) -> str:
    """A string, or text parts joined (input_text / output_text: only text is supported)."""
    if isinstance(content, str):
        check_text(content, where)
        return content
    if not isinstance(content, list):
        raise InvalidRequest(f"{where} must be a string or a list of text parts", param=where)
    texts = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind not in TEXT_PARTS or not isinstance(part.get("text"), str):
            raise InvalidRequest(f"{where}[{j}] must be {{'type': 'input_text', 'text': str}}; got type "
                                 f"{describe(kind)} (only text is supported)", param=f"{where}[{j}]")
        unknown = sorted(k for k in part if k not in PART_KEYS)
        if unknown:
            raise InvalidRequest(f"{where}[{j}]: unknown field {describe(unknown[0])}",
                                 param=f"{where}[{j}].{unknown[0]}")
        check_text(part["text"], f"{where}[{j}].text")
        texts.append(part["text"])
    return "".join(texts)


def to_messages(instructions: str | None, items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Chat messages for plain items: `instructions` first as the system message; function calls
    join the assistant message they follow (a model's text then its calls is one turn)."""
    messages: list[dict[str, Any]] = []
    if instructions:
        messages.append({"role": "system", "content": instructions})
    for item in items:
        kind = item["type"]
        if kind == "message":
            messages.append({"role": item["role"], "content": item["content"]})
        elif kind == "function_call":
            call = {"id": item["call_id"], "type": "function",
                    "function": {"name": item["name"], "arguments": item["arguments"]}}
            if messages and messages[-1]["role"] == "assistant":
                messages[-1].setdefault("tool_calls", []).append(call)
            else:
                messages.append({"role": "assistant", "content": "", "tool_calls": [call]})
        else:
            messages.append({"role": "tool", "tool_call_id": item["call_id"], "content": item["output"]})
    return messages
