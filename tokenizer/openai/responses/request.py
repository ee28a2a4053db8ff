"""A /v1/responses body parsed into the typed request, and the fields the response object echoes.

    parsed = parse_response(body, config, model, owner)
    req = parsed.request(history)        # the previous response's conversation + the new items

Mapping: input items (after the previous response's history) become chat messages, instructions
first; function tools, tool_choice and text.format become the tool plan and the grammar;
max_output_tokens is max_new_tokens. A reasoning effort needs a server that splits reasoning out
(--reasoning-parser). Accepted and echoed only: metadata, user, store, include, truncation (the
server never truncates), service_tier, prompt_cache_key (a routing label, never the cache's
namespace: `cache_salt` / `extra_key` set that), safety_identifier.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from runtime.contracts.config import ServerConfig
from runtime.contracts.errors import InvalidRequest
from runtime.contracts.json_text import client_json
from runtime.contracts.sampling import ANY_JSON
from tokenizer.core.json_bounds import load_json_text
from tokenizer.core.reasoning import PARSERS as REASONING_PARSERS
from tokenizer.core.request import ChatInput, GenRequest, PromptRequest, ReadOptions
from tokenizer.core.spec import BRACKETS, parse
from tokenizer.core.tools import ToolPlan, function, openai_choice, tool_grammar, tool_plan
from tokenizer.openai.responses.spec import FunctionCallItem, FunctionOutputItem, MessageItem, ResponseBody

ECHOED = ("user", "service_tier", "prompt_cache_key", "safety_identifier", "include")
ERROR_NAMES = {"max_new_tokens": "max_output_tokens", "input_ids": "input", "text": "input", "messages": "input",
               "json_schema": "text.format", "min_new_tokens": "max_output_tokens"}


@dataclass(frozen=True, slots=True)
class ResponseRequest:
    """A parsed body: its new items (plain form), the request template, and the echo."""

    items: list[dict[str, Any]]
    store: bool
    previous_response_id: str | None
    salt: str | None
    echo: dict[str, Any]
    template: GenRequest  # its one prompt's messages are filled in by `request`
    instructions: str | None

    def request(self, history: list[dict[str, Any]], rid: str) -> GenRequest:
        """The typed request over `history` (the previous response's conversation) + the new items."""
        prompt = self.template.prompts[0]
        chat = prompt.prompt
        assert isinstance(chat, ChatInput)
        chat = dataclasses.replace(chat, messages=to_messages(self.instructions, history + self.items))
        return dataclasses.replace(self.template, prompts=[dataclasses.replace(prompt, prompt=chat, rid=rid)])


def parse_response(raw: Any, config: ServerConfig, owner: str = "") -> ResponseRequest:
    """A /v1/responses body (InvalidRequest naming the field)."""
    body = parse(ResponseBody, raw, BRACKETS)
    if body.stream_options is not None and not body.stream:
        raise InvalidRequest.field("stream_options", "is only allowed when stream is true")
    effort = body.reasoning.effort if body.reasoning is not None else None
    fmt = REASONING_PARSERS.get(config.reasoning_parser)
    if effort is not None and fmt is None:
        raise InvalidRequest.field("reasoning.effort", "needs a server started with --reasoning-parser")
    plan = _tools(body)
    grammar = _grammar(body, plan)
    sampling: dict[str, Any] = {**grammar}
    for name in ("temperature", "top_p"):
        if getattr(body, name) is not None:
            sampling[name] = getattr(body, name)
    if body.max_output_tokens is not None:
        sampling["max_new_tokens"] = body.max_output_tokens
    salt = "\x00".join(k for k in (body.cache_salt, body.extra_key) if k is not None) or None
    prompt = PromptRequest(ChatInput([], {}, plan), "", sampling, field="input")
    read = ReadOptions(fmt, True, plan, config.tool_call_parser)
    names = {**ERROR_NAMES, "json_schema": "tools" if plan is not None and plan.choice.forced else "text.format"}
    template = GenRequest([prompt], stream=bool(body.stream), priority=body.priority, cache_namespace=salt, owner=owner,
                          read=read, names=names, default_max_tokens=body.max_output_tokens is None)
    items = check_input(body)
    store = body.store is not False
    return ResponseRequest(items, store, body.previous_response_id, salt, _echo(body, plan, store), template,
                           body.instructions)


def _tools(body: ResponseBody) -> ToolPlan | None:
    functions = [function(t.name, t.description, t.parameters) for t in body.tools or []]
    choice = body.tool_choice
    named = choice.name if choice is not None and not isinstance(choice, str) else None
    mode = openai_choice(choice if isinstance(choice, str) else None, named, functions)
    return tool_plan(functions, mode, body.parallel_tool_calls is not False)


def _grammar(body: ResponseBody, plan: ToolPlan | None) -> dict[str, str]:
    fmt = body.text.format if body.text is not None else None
    forced = plan is not None and plan.choice.forced
    if fmt is not None and fmt.type != "text" and forced:
        raise InvalidRequest.field("tool_choice", "a forced tool call cannot be combined with text.format: give one "
                                                  "constraint")
    if forced:
        return tool_grammar(plan)
    if fmt is None or fmt.type == "text":
        return {}
    if fmt.type == "json_object":
        return {"json_schema": ANY_JSON}
    return {"json_schema": client_json(fmt.schema_, "text.format.schema")}


def check_input(body: ResponseBody) -> list[dict[str, Any]]:
    """`input` in the plain form the store keeps as history (reasoning items dropped)."""
    if isinstance(body.input, str):
        return [{"type": "message", "role": "user", "content": body.input}]
    out = []
    for i, item in enumerate(body.input):
        if isinstance(item, MessageItem):
            out.append({"type": "message", "role": item.role, "content": _text(item.content)})
        elif isinstance(item, FunctionCallItem):
            load_json_text(item.arguments, f"input[{i}].arguments")  # NOTE: checked; rendering parses it again
            out.append({"type": "function_call", "call_id": item.call_id, "name": item.name,
                        "arguments": item.arguments})
        elif isinstance(item, FunctionOutputItem):
            out.append({"type": "function_call_output", "call_id": item.call_id, "output": _text(item.output)})
    return out


def _text(content: Any) -> str:
    return content if isinstance(content, str) else "".join(part.text for part in content)


def _echo(body: ResponseBody, plan: ToolPlan | None, store: bool) -> dict[str, Any]:
    """The request's fields the response object repeats (all typed and bounded by the spec)."""
    dumped = body.model_dump(by_alias=True, exclude_none=False)
    reasoning = body.reasoning
    summary = None if reasoning is None else (reasoning.summary or reasoning.generate_summary)
    text_format = (dumped.get("text") or {}).get("format") or {"type": "text"}
    tools = [{k: v for k, v in t.items() if v is not None} for t in dumped.get("tools") or []]
    choice = dumped.get("tool_choice") or ("auto" if plan is not None else "none")
    return {"instructions": body.instructions, "max_output_tokens": body.max_output_tokens,
            "metadata": body.metadata, "parallel_tool_calls": body.parallel_tool_calls is not False,
            "previous_response_id": body.previous_response_id,
            "reasoning": {"effort": None if reasoning is None else reasoning.effort, "summary": summary},
            "store": store, "temperature": body.temperature, "top_p": body.top_p,
            "text": {"format": {k: v for k, v in text_format.items() if v is not None}},
            "tool_choice": choice, "tools": tools, "truncation": body.truncation or "disabled", "background": False,
            **{k: dumped.get(k) for k in ECHOED}}


def to_messages(instructions: str | None, items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Chat messages for plain items: `instructions` first as the system message; function calls
    join the assistant message they follow (a model's text then its calls is one turn)."""
    messages: list[dict[str, Any]] = []
    if instructions:
        messages.append({"role": "system", "content": instructions})
    for item in items:
        kind = item["type"]
        if kind == "message":
            messages.append({"role": "system" if item["role"] == "developer" else item["role"],
                             "content": item["content"]})
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
