"""Responses `tools`, `tool_choice` and `text.format` in chat's shapes (pure). The chat
pipeline (`tokenizer/openai/constraints.py`) then checks names, schemas and combinations and
builds the grammar of a forced call; this module checks only the Responses shapes around them.

    {"type": "function", "name", "description", "parameters", "strict"}   a function tool
    tool_choice "none" | "auto" | "required" | {"type": "function", "name"}
    text.format {"type": "text"} | {"type": "json_object"}
                | {"type": "json_schema", "name", "schema", "strict", "description"}

Built-in tools (web_search, file_search, ...) and other tool_choice kinds are 400s naming the
field: this server runs only the client's functions.
"""

from __future__ import annotations

from typing import Any

from runtime.contracts.errors import InvalidRequest
from tokenizer.openai.json_bounds import describe

TOOL_KEYS = {"type", "name", "description", "parameters", "strict", "defer_loading", "output_schema"}
FORMAT_KEYS = {"text": {"type"}, "json_object": {"type"},
               "json_schema": {"type", "name", "schema", "strict", "description"}}


def check_tools(tools: Any) -> list[dict[str, Any]]:
    """Function tools as {type, name, description?, parameters?, strict?} (names and schemas are
    checked by the chat pipeline)."""
    if tools is None:
        return []
    if not isinstance(tools, list):
        raise InvalidRequest("tools must be a list of function tools", param="tools")
    out = []
    for i, tool in enumerate(tools):
        where = f"tools[{i}]"
        kind = tool.get("type") if isinstance(tool, dict) else None
        if kind != "function":
            raise InvalidRequest(f"{where}.type must be 'function' (only function tools are supported), got "
                                 f"{describe(kind)}", param=f"{where}.type")
        unknown = sorted(k for k in tool if k not in TOOL_KEYS)
        if unknown:
            raise InvalidRequest(f"{where}: unknown field {describe(unknown[0])}", param=f"{where}.{unknown[0]}")
        if tool.get("defer_loading"):
            raise InvalidRequest("deferred tool loading is not supported", param=f"{where}.defer_loading")
        out.append({k: tool[k] for k in ("type", "name", "description", "parameters", "strict")
                    if tool.get(k) is not None})
    return out


def check_tool_choice(choice: Any) -> Any:
    """`tool_choice` in chat's shape (the chat pipeline checks that a named function exists)."""
    if choice is None or isinstance(choice, str):
        return choice  # none | auto | required: checked by the chat pipeline
    if isinstance(choice, dict) and choice.get("type") == "function" and set(choice) <= {"type", "name"}:
        return {"type": "function", "function": {"name": choice.get("name")}}
    raise InvalidRequest(f"tool_choice must be none, auto, required or {{'type': 'function', 'name': ...}}, "
                         f"got {describe(choice)}", param="tool_choice")


def check_text_format(text: Any) -> dict[str, Any] | None:
    """`text.format` as chat's `response_format` (None: plain text)."""
    if text is None:
        return None
    if not isinstance(text, dict) or any(k not in ("format", "verbosity") for k in text):
        raise InvalidRequest("text must be an object {format, verbosity}", param="text")
    if text.get("verbosity") not in (None, "low", "medium", "high"):
        raise InvalidRequest("text.verbosity must be low, medium or high", param="text.verbosity")
    fmt = text.get("format")
    if fmt is None:
        return None
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    if kind not in FORMAT_KEYS:
        raise InvalidRequest(f"text.format.type must be one of {sorted(FORMAT_KEYS)}, got {describe(kind)}",
                             param="text.format.type")
    unknown = sorted(k for k in fmt if k not in FORMAT_KEYS[kind])
    if unknown:
        raise InvalidRequest(f"text.format: unknown field {describe(unknown[0])}", param=f"text.format.{unknown[0]}")
    if kind != "json_schema":
        return {"type": kind}
    spec = {k: fmt[k] for k in ("name", "schema", "strict") if k in fmt}
    return {"type": "json_schema", "json_schema": spec}
