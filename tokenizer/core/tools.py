"""Callable tools, whatever protocol declared them: the `ToolPlan` a request's output is read
with, and the grammar that forces a call (pure: no tokenizer, no I/O).

    plan = tool_plan(functions, ToolChoice("required"), parallel=True)
    grammar = tool_grammar(plan)          # {"json_schema": ...} when a call is forced, else {}

    choice auto (the default)   no constraint; outputs are parsed for calls (`tool_calls.py`)
    choice named                the output is one call of that function
    choice required             a JSON array of one or more calls (one call when not parallel)
    choice none                 no tools: not in the prompt, not parsed (`tool_plan` gives None)

Functions are {name, description?, parameters} dicts, checked by the protocol's spec (names
1-64 of [A-Za-z0-9_-], parameters a JSON schema of an object).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from runtime.contracts.errors import InvalidRequest
from runtime.contracts.json_text import client_json

TOOL_NAME = r"^[A-Za-z0-9_-]{1,64}$"
EMPTY_PARAMETERS: dict[str, Any] = {"type": "object", "properties": {}}


@dataclass(frozen=True, slots=True)
class ToolChoice:
    """`mode` is none | auto | required | named (then `name` is the function)."""

    mode: str
    name: str | None = None

    @property
    def forced(self) -> bool:
        return self.mode in ("required", "named")


@dataclass(frozen=True, slots=True)
class ToolPlan:
    """The tools a request may call and how it may call them."""

    functions: list[dict[str, Any]]
    choice: ToolChoice
    parallel: bool = True  # several calls allowed

    @property
    def names(self) -> list[str]:
        return [f["name"] for f in self.functions]

    def as_openai_tools(self) -> list[dict[str, Any]]:
        """The `tools` list in OpenAI's shape, as Hugging Face chat templates take it."""
        return [{"type": "function", "function": f} for f in self.functions]


def function(name: str, description: str | None, parameters: dict[str, Any] | None) -> dict[str, Any]:
    """A function as the plan holds it (parameters default to an object without properties)."""
    out: dict[str, Any] = {"name": name}
    if description:
        out["description"] = description
    out["parameters"] = EMPTY_PARAMETERS if parameters is None else parameters
    return out


def openai_choice(mode: str | None, named: str | None, functions: list[dict[str, Any]]) -> ToolChoice:
    """OpenAI's `tool_choice` (chat and Responses): none | auto | required, a named function, or
    absent (auto with tools, none without)."""
    if named is not None:
        return ToolChoice("named", named)
    if mode is None:
        return ToolChoice("auto" if functions else "none")
    return ToolChoice(mode)


def tool_plan(functions: list[dict[str, Any]], choice: ToolChoice, parallel: bool = True,
              param: str = "tools", choice_param: str = "tool_choice") -> ToolPlan | None:
    """The plan, or None (no tools, or choice none). Raises InvalidRequest naming `param` for a
    name used twice, or `choice_param` for a choice that names a missing function or needs one."""
    seen: set[str] = set()
    for f in functions:
        if f["name"] in seen:
            raise InvalidRequest.field(param, f"the function name {f['name']!r} is used twice")
        seen.add(f["name"])
    if choice.mode == "named" and choice.name not in seen:
        raise InvalidRequest.field(choice_param, f"names the function {choice.name!r}, which is not in {param}")
    if choice.mode == "required" and not functions:
        raise InvalidRequest.field(choice_param, f"forcing a call needs {param}")
    if choice.mode == "none" or not functions:
        return None
    return ToolPlan(functions, choice, parallel)


def tool_grammar(plan: ToolPlan | None, param: str = "tools") -> dict[str, str]:
    """The sampling fields that force a call ({} when none is forced)."""
    schema = forced_call_schema(plan) if plan is not None else None
    return {} if schema is None else {"json_schema": client_json(schema, param)}


def forced_call_schema(plan: ToolPlan) -> dict[str, Any] | None:
    """The JSON schema of what a forced call's output may be, or None when no call is forced:
    one call object, or for choice required with parallel calls a JSON array of one or more.

    NOTE: `$defs` / `definitions` of the parameter schemas move to the root, where their
    `#/$defs/...` references resolve once the parameters are nested under `arguments`.
    """
    if not plan.choice.forced:
        return None
    chosen = [f for f in plan.functions if plan.choice.mode == "required" or f["name"] == plan.choice.name]
    defs: dict[str, dict[str, Any]] = {}
    options = [_call_schema(f, defs) for f in chosen]
    call: dict[str, Any] = dict(options[0]) if len(options) == 1 else {"anyOf": options}
    several = plan.choice.mode == "required" and plan.parallel
    schema = {"type": "array", "minItems": 1, "items": call} if several else call
    schema.update(defs)
    return schema


def _call_schema(fn: dict[str, Any], defs: dict[str, dict[str, Any]]) -> dict[str, Any]:
    params = dict(fn["parameters"])
    for key in ("$defs", "definitions"):
        for name, sub in (params.pop(key, None) or {}).items():
            table = defs.setdefault(key, {})
            if table.get(name, sub) != sub:
                raise InvalidRequest(f"tools: two functions define {key}/{name} differently", param="tools")
            table[name] = sub
    return {"type": "object", "properties": {"name": {"const": fn["name"]}, "arguments": params},
            "required": ["name", "arguments"], "additionalProperties": False}
