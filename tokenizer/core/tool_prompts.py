"""The prompt side of OpenAI tool calls (pure: no tokenizer, no I/O): `adapt_to_template` passes
`tools` and tool messages to a template whose source uses them; for one that knows nothing about
tools (SmolLM2's ChatML) `with_tool_prompt` adds a Hermes-style system instruction listing the
tools, and `messages_as_text` turns assistant `tool_calls` and `role: "tool"` messages into text,
so a conversation can continue after a call. Reading calls back out: `tool_calls.py`.
"""

from __future__ import annotations

from typing import Any

import orjson

from runtime.contracts.json_text import client_json
from tokenizer.core.tool_scan import CLOSE_TAG, OPEN_TAG

TOOL_PROMPT = (
    "You can call functions. To call one, reply with a JSON object naming the function and giving "
    "its arguments, inside <tool_call></tool_call> tags:\n"
    '<tool_call>\n{"name": "<function name>", "arguments": {<arguments>}}\n</tool_call>\n'
    "You may make several calls, one block each. If no function is needed, answer normally.\n"
    "The functions:\n"
)


def with_tool_prompt(messages: list[dict[str, Any]],
                     functions: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The messages with the tool instruction added to the system message (or a new first one)."""
    listing = "\n".join(client_json(f, "tools", ensure_ascii=False) for f in functions)
    prompt = TOOL_PROMPT + listing
    if messages and messages[0]["role"] == "system":
        first = {**messages[0], "content": f"{messages[0]['content']}\n\n{prompt}"}
        return [first, *messages[1:]]
    return [{"role": "system", "content": prompt}, *messages]


def messages_as_text(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Assistant tool calls as `<tool_call>` text and tool results as user messages holding
    `<tool_response>` blocks (consecutive results in one message, as Qwen2.5's template does)."""
    out: list[dict[str, Any]] = []
    after_tool = False
    for m in messages:
        if m["role"] == "tool":
            block = f"<tool_response>\n{m['content']}\n</tool_response>"
            if after_tool:
                out[-1] = {"role": "user", "content": out[-1]["content"] + "\n" + block}
            else:
                out.append({"role": "user", "content": block})
        elif m["role"] == "assistant" and m.get("tool_calls"):
            blocks = [f"{OPEN_TAG}\n{_call_text(c)}\n{CLOSE_TAG}" for c in m["tool_calls"]]
            text = "\n".join([m["content"], *blocks] if m["content"] else blocks)
            out.append({"role": "assistant", "content": text})
        else:
            out.append({"role": m["role"], "content": m["content"]})
        after_tool = m["role"] == "tool"
    return out


def adapt_to_template(template: str, messages: list[dict[str, Any]],
                      kwargs: dict[str, Any]) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Tools and tool messages in the form the template takes: natively when its source uses
    `tools` / `tool_calls`, else as text (a system instruction; `<tool_call>` blocks)."""
    tools = kwargs.get("tools")
    if tools and "tools" not in template:
        kwargs = {k: v for k, v in kwargs.items() if k != "tools"}
        functions = [t["function"] for t in tools if isinstance(t, dict) and "function" in t]
        messages = with_tool_prompt(messages, functions)
    if any(m.get("tool_calls") or m["role"] == "tool" for m in messages):
        native = "tool_calls" in template
        messages = messages_for_template(messages) if native else messages_as_text(messages)
    return messages, kwargs


def messages_for_template(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Messages for a template that renders tool calls itself: `arguments` as objects, which
    is what HF templates expect (they apply `tojson` to them)."""
    out = []
    for m in messages:
        if m.get("tool_calls"):
            calls = [{**c, "function": {**c["function"], "arguments": _arguments(c)}}
                     for c in m["tool_calls"]]
            m = {**m, "tool_calls": calls}
        out.append(m)
    return out


def _call_text(call: dict[str, Any]) -> str:
    return client_json({"name": call["function"]["name"], "arguments": _arguments(call)}, "messages",
                       ensure_ascii=False)


def _arguments(call: dict[str, Any]) -> Any:
    """A history call's arguments as an object when they are JSON text. NOTE: orjson, which
    cannot recurse too deep nor yield a lone surrogate (the request check refused JSON that only
    the stdlib parser reads: `json_bounds.load_json_text`)."""
    args = call["function"]["arguments"]
    if isinstance(args, str):
        try:
            return orjson.loads(args)
        except orjson.JSONDecodeError:
            pass  # NOTE: kept as the client sent it: the history is rendered, not judged
    return args
