"""OpenAI chat constraints: `response_format`, `tools` and `tool_choice` become the request's
grammar (a `sampling_params` field) and its `ToolPlan` (pure: no tokenizer, no I/O).

    response_format {"type": "text"}                -> no constraint
    response_format {"type": "json_object"}         -> json_schema "$$ANY$$" (any JSON)
    response_format {"type": "json_schema", "json_schema": {"name", "schema", "strict"}}
                                                    -> json_schema = the schema's JSON text
    tools + tool_choice auto (the default)          -> no constraint; outputs parsed for calls
    tools + tool_choice a named function            -> json_schema of one call of it
    tools + tool_choice required                    -> json_schema of a JSON array of one or more
                                                       calls (one call with parallel_tool_calls
                                                       false)
    tool_choice none                                -> the tools are ignored

`parallel_tool_calls` (default true): false allows at most one call; the forced grammars
enforce it, and with tool_choice auto the parser keeps the first call (`tool_calls.py`). A
named tool_choice forces exactly one call of that function either way (as SGLang reads it).

At most one constraint per request: response_format or a forced call together with another
grammar (regex, json_schema, ebnf extras) is a 400 naming the field. The schema itself is
compiled and checked by the TokenizerManager; `renames` maps the manager's field name back to
the request's, so an invalid schema is reported as the field the client wrote.
"""

from __future__ import annotations

import re
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any

from runtime.contracts.errors import InvalidRequest
from runtime.contracts.json_text import client_json
from tokenizer.openai.json_bounds import check_text, check_value, describe

ANY_JSON = "$$ANY$$"  # SGLang's json_schema sentinel: any JSON value
GRAMMAR_FIELDS = ("regex", "json_schema", "ebnf")
_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
_EMPTY_PARAMETERS: dict[str, Any] = {"type": "object", "properties": {}}


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
    """The tools a chat request may call (validated function dicts) and how it may call them."""

    functions: list[dict[str, Any]]
    choice: ToolChoice
    parallel: bool = True  # parallel_tool_calls: several calls allowed

    @property
    def names(self) -> list[str]:
        return [f["name"] for f in self.functions]

    def as_openai_tools(self) -> list[dict[str, Any]]:
        """The `tools` list in OpenAI's shape, as HF chat templates take it."""
        return [{"type": "function", "function": f} for f in self.functions]


@dataclass(frozen=True, slots=True)
class ChatConstraints:
    """What a chat request's constraints add: grammar fields for `sampling_params`, manager ->
    request field names for errors, and the callable tools (None: no tool parsing)."""

    grammar: dict[str, str] = field(default_factory=dict)
    renames: dict[str, str] = field(default_factory=dict)
    tools: ToolPlan | None = None


def chat_constraints(req: dict[str, Any]) -> ChatConstraints:
    """The constraints of a chat request (its other fields are checked elsewhere)."""
    grammar, renames = _response_format(req)
    taken = [g for g in GRAMMAR_FIELDS if req.get(g) is not None] + (
        ["response_format"] if grammar else [])
    tools = _tool_plan(req, taken)
    if tools is not None and tools.choice.forced:
        schema = client_json(forced_call_schema(tools), "tools")
        return ChatConstraints({"json_schema": schema}, {"json_schema": "tools"}, tools)
    return ChatConstraints(grammar, renames, tools)


def _response_format(req: dict[str, Any]) -> tuple[dict[str, str], dict[str, str]]:
    """(grammar fields, renames) for `response_format`."""
    fmt = req.get("response_format")
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    if fmt is None or kind == "text":
        return {}, {}
    if kind not in ("json_object", "json_schema"):
        raise InvalidRequest("response_format must be an object whose type is one of text, "
                             f"json_object, json_schema; got {describe(kind)}",
                             param="response_format")
    given = [g for g in GRAMMAR_FIELDS if req.get(g) is not None]
    if given:
        raise InvalidRequest(f"response_format {kind} cannot be combined with {given[0]}: give "
                             "one constraint", param="response_format")
    if kind == "json_object":
        return {"json_schema": ANY_JSON}, {"json_schema": "response_format"}
    spec = fmt.get("json_schema")
    if not isinstance(spec, dict):
        raise InvalidRequest("response_format.json_schema must be an object {name, schema, "
                             "strict}", param="response_format.json_schema")
    checks = (("name", isinstance(spec.get("name") or "", str), "a string"),
              ("strict", isinstance(spec.get("strict"), (bool, type(None))), "a boolean"),
              ("schema", isinstance(spec.get("schema"), dict), "a JSON schema object"))
    for name, ok, what in checks:
        if not ok:
            raise InvalidRequest(f"response_format.json_schema.{name} must be {what}",
                                 param=f"response_format.json_schema.{name}")
    where = "response_format.json_schema.schema"
    return {"json_schema": client_json(spec["schema"], where)}, {"json_schema": where}


def _tool_plan(req: dict[str, Any], taken: list[str]) -> ToolPlan | None:
    """The callable tools, or None (no tools, or tool_choice none). `taken`: grammar fields
    already given, which a forced call cannot be combined with."""
    tools = req.get("tools")
    parallel = req.get("parallel_tool_calls")
    if not isinstance(parallel, (bool, type(None))):
        raise InvalidRequest(f"parallel_tool_calls must be a boolean, got {describe(parallel)}",
                             param="parallel_tool_calls")
    parallel = parallel is not False
    functions = check_tools(tools) if tools is not None else []
    choice = check_tool_choice(req.get("tool_choice"), [f["name"] for f in functions])
    if choice.mode == "none" or not functions:
        return None
    if choice.forced and taken:
        raise InvalidRequest(f"a forced tool call (tool_choice {choice.mode}) cannot be combined "
                             f"with {taken[0]}: give one constraint", param="tool_choice")
    return ToolPlan(functions, choice, parallel)


def check_tools(tools: Any) -> list[dict[str, Any]]:
    """Validated `tools` as function dicts {name, description?, parameters} (parameters default
    to an object without properties; `strict` is accepted: a forced call is always strict)."""
    if not isinstance(tools, list):
        raise InvalidRequest("tools must be a list of tool objects", param="tools")
    functions = [_check_tool(tool, f"tools[{i}]") for i, tool in enumerate(tools)]
    seen: set[str] = set()
    for i, f in enumerate(functions):
        if f["name"] in seen:
            raise InvalidRequest(f"tools: the function name {f['name']!r} is used twice",
                                 param=f"tools[{i}].function.name")
        seen.add(f["name"])
    return functions


def _check_tool(tool: Any, where: str) -> dict[str, Any]:
    if not isinstance(tool, dict) or tool.get("type") != "function":
        raise InvalidRequest(f"{where} must be {{'type': 'function', 'function': {{...}}}}",
                             param=f"{where}.type")
    fn = tool.get("function")
    if not isinstance(fn, dict):
        raise InvalidRequest(f"{where}.function must be an object", param=f"{where}.function")
    name = fn.get("name")
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise InvalidRequest(f"{where}.function.name must be 1-64 letters, digits, _ or -, got "
                             f"{describe(name)}", param=f"{where}.function.name")
    description = fn.get("description", "")
    if not isinstance(description, (str, type(None))):
        raise InvalidRequest(f"{where}.function.description must be a string",
                             param=f"{where}.function.description")
    check_text(description or "", f"{where}.function.description")
    if not isinstance(fn.get("strict", False), (bool, type(None))):
        raise InvalidRequest(f"{where}.function.strict must be a boolean",
                             param=f"{where}.function.strict")
    params = fn.get("parameters")
    params = _EMPTY_PARAMETERS if params is None else params
    if not isinstance(params, dict) or params.get("type", "object") != "object":
        raise InvalidRequest(f"{where}.function.parameters must be a JSON schema of an object",
                             param=f"{where}.function.parameters")
    check_value(params, f"{where}.function.parameters")  # rendered with tojson, dumped for grammars
    out: dict[str, Any] = {"name": name}
    if fn.get("description"):
        out["description"] = fn["description"]
    out["parameters"] = params
    return out


def check_tool_choice(choice: Any, names: Collection[str]) -> ToolChoice:
    """`tool_choice` against the given tool names (auto when tools are given, else none)."""
    if choice is None:
        return ToolChoice("auto" if names else "none")
    if choice in ("none", "auto", "required"):
        if choice == "required" and not names:
            raise InvalidRequest("tool_choice 'required' needs tools", param="tool_choice")
        return ToolChoice(choice)
    fn = choice.get("function") if isinstance(choice, dict) else None
    if not isinstance(choice, dict) or choice.get("type") != "function" or not isinstance(fn, dict):
        raise InvalidRequest(f"tool_choice must be none, auto, required or {{'type': 'function', "
                             f"'function': {{'name': ...}}}}, got {describe(choice)}",
                             param="tool_choice")
    name = fn.get("name")
    if name not in names:
        raise InvalidRequest(f"tool_choice names the function {describe(name)}, which is not in "
                             "tools",
                             param="tool_choice")
    return ToolChoice("named", name)


# ---------------------------------------------------------------- forced calls


def forced_call_schema(plan: ToolPlan) -> dict[str, Any] | None:
    """The JSON schema of what a forced call's output may be, or None when no call is forced:
    one call object, or for tool_choice required with parallel calls a JSON array of one or
    more call objects.

    NOTE: `$defs` / `definitions` of the parameter schemas move to the root, where their
    `#/$defs/...` references resolve once the parameters are nested under `arguments`.
    """
    if not plan.choice.forced:
        return None
    chosen = [f for f in plan.functions
              if plan.choice.mode == "required" or f["name"] == plan.choice.name]
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
                raise InvalidRequest(f"tools: two functions define {key}/{name} differently",
                                     param="tools")
            table[name] = sub
    return {"type": "object", "properties": {"name": {"const": fn["name"]}, "arguments": params},
            "required": ["name", "arguments"], "additionalProperties": False}
