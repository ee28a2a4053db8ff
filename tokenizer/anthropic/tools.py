"""Anthropic's `tools` and `tool_choice` -> the chat pipeline's `ToolPlan` and grammar
(`tokenizer.openai.constraints`):

    tools [{name, description?, input_schema}]   -> functions {name, description?, parameters}
    tool_choice {"type": "auto"} (the default)    -> outputs parsed for calls, no constraint
    tool_choice {"type": "any"}                   -> a call of any tool, forced by the grammar
    tool_choice {"type": "tool", "name": N}       -> a call of N, forced by the grammar
    tool_choice {"type": "none"}                  -> no tools: not in the prompt, not parsed

`disable_parallel_tool_use` is OpenAI's `parallel_tool_calls: false`: one call at most (the
scanner drops later ones; `any` forces one call instead of a list of them).
Server tools (web search, code execution, ...) are not supported: a tool's `type` may only be
"custom".
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from runtime.contracts.json_text import client_json
from tokenizer.anthropic.blocks import fail
from tokenizer.openai.constraints import ToolChoice, ToolPlan, forced_call_schema
from tokenizer.openai.json_bounds import check_text, check_value, describe

NAME = re.compile(r"[A-Za-z0-9_-]{1,128}")
TOOL_KEYS = {"name", "description", "input_schema", "type", "cache_control"}
CHOICE_MODES = {"auto": "auto", "any": "required", "tool": "named", "none": "none"}


@dataclass(frozen=True, slots=True)
class AnthropicTools:
    """The callable tools (None: no tools, or tool_choice none) and the grammar fields that
    force a call."""

    plan: ToolPlan | None
    grammar: dict[str, str]


def check_tools(tools: Any, choice: Any) -> AnthropicTools:
    """Validated `tools` and `tool_choice` (see the module docstring)."""
    functions = [] if tools is None else _functions(tools)
    mode, name, single = _choice(choice, [f["name"] for f in functions])
    if mode == "none" or not functions:
        return AnthropicTools(None, {})
    plan = ToolPlan(functions, ToolChoice(mode, name), parallel=not single)
    grammar = {}
    if plan.choice.forced:
        grammar = {"json_schema": client_json(forced_call_schema(plan), "tools")}
    return AnthropicTools(plan, grammar)


def _functions(tools: Any) -> list[dict[str, Any]]:
    if not isinstance(tools, list):
        raise fail("tools", f"must be a list of tools, got {describe(tools)}")
    functions = [_tool(t, f"tools.{i}") for i, t in enumerate(tools)]
    seen: set[str] = set()
    for i, f in enumerate(functions):
        if f["name"] in seen:
            raise fail(f"tools.{i}.name", f"the tool name {f['name']!r} is used twice")
        seen.add(f["name"])
    return functions


def _tool(tool: Any, where: str) -> dict[str, Any]:
    if not isinstance(tool, dict):
        raise fail(where, f"must be an object, got {describe(tool)}")
    unknown = sorted(set(tool) - TOOL_KEYS)
    if unknown:
        raise fail(f"{where}.{unknown[0]}", "unknown field")
    if tool.get("type") not in (None, "custom"):
        raise fail(f"{where}.type", f"only custom tools are supported, got {describe(tool['type'])}")
    name = tool.get("name")
    if not isinstance(name, str) or not NAME.fullmatch(name):
        raise fail(f"{where}.name", f"must be 1-128 letters, digits, _ or -, got {describe(name)}")
    description = tool.get("description")
    if description is not None and not isinstance(description, str):
        raise fail(f"{where}.description", f"must be a string, got {describe(description)}")
    check_text(description or "", f"{where}.description")
    schema = tool.get("input_schema")
    if not isinstance(schema, dict) or schema.get("type") != "object":
        raise fail(f"{where}.input_schema", "must be a JSON schema with type 'object'")
    check_value(schema, f"{where}.input_schema")  # rendered into the prompt, compiled to a grammar
    if tool.get("cache_control") is not None:
        check_value(tool["cache_control"], f"{where}.cache_control")
    out: dict[str, Any] = {"name": name}
    if description:
        out["description"] = description
    out["parameters"] = schema
    return out


def _choice(choice: Any, names: list[str]) -> tuple[str, str | None, bool]:
    """(ToolChoice mode, the named tool, disable_parallel_tool_use) of `tool_choice`."""
    if choice is None:
        return "auto", None, False
    kind = choice.get("type") if isinstance(choice, dict) else None
    if not isinstance(choice, dict) or kind not in CHOICE_MODES:
        raise fail("tool_choice.type" if isinstance(choice, dict) else "tool_choice",
                   f"must be an object whose type is auto, any, tool or none, got "
                   f"{describe(kind if isinstance(choice, dict) else choice)}")
    unknown = sorted(set(choice) - {"type", "name", "disable_parallel_tool_use"})
    if unknown:
        raise fail(f"tool_choice.{unknown[0]}", "unknown field")
    single = choice.get("disable_parallel_tool_use")
    if single is not None and not isinstance(single, bool):
        raise fail("tool_choice.disable_parallel_tool_use", f"must be a boolean, got {describe(single)}")
    name = choice.get("name")
    if kind == "tool" and name not in names:
        raise fail("tool_choice.name", f"names the tool {describe(name)}, which is not in tools")
    if kind != "tool" and name is not None:
        raise fail("tool_choice.name", f"is only allowed with type 'tool', not {kind!r}")
    if kind == "any" and not names:
        raise fail("tool_choice", "type 'any' needs tools")
    return CHOICE_MODES[kind], name if kind == "tool" else None, bool(single)
