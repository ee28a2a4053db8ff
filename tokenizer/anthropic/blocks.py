"""Anthropic's `system` and `messages` -> the chat messages the chat template renders (the shape
`tokenizer.openai.messages.check_messages` produces, so tool history goes through the same
`tool_prompts.adapt_to_template`):

    user text blocks          -> {"role": "user", "content": text}
    user tool_result blocks   -> {"role": "tool", "content": text, "tool_call_id": id}, first
    assistant text blocks     -> {"role": "assistant", "content": text, "tool_calls": [...]}
    assistant tool_use blocks -> OpenAI tool_calls whose `arguments` is the `input` object

Rules, each a 400 naming the field as Anthropic does (`messages.1.content.0.type`): roles are
user and assistant, the first and the last message are the user's (no assistant prefill), a
tool_result answers a tool_use of the assistant message just before it, and only text,
tool_use and tool_result blocks are taken (images, documents and thinking are not supported).
Text blocks are joined with a blank line. `cache_control` is accepted and ignored: the radix
cache reuses every shared prefix by itself.
"""

from __future__ import annotations

from typing import Any

from runtime.contracts.errors import InvalidRequest
from tokenizer.openai.json_bounds import check_text, check_value, describe

ROLES = ("user", "assistant")
BLOCK_KEYS = {  # block type -> the keys it may have
    "text": {"type", "text", "cache_control", "citations"},
    "tool_use": {"type", "id", "name", "input", "cache_control"},
    "tool_result": {"type", "tool_use_id", "content", "is_error", "cache_control"},
}
ROLE_BLOCKS = {"user": ("text", "tool_result"), "assistant": ("text", "tool_use")}
UNSUPPORTED = ("image", "document", "thinking", "redacted_thinking", "search_result",
               "server_tool_use", "web_search_tool_result", "container_upload")


def fail(where: str, problem: str) -> InvalidRequest:
    """A 400 about field `where`, led by its name."""
    return InvalidRequest(f"{where}: {problem}", param=where)


def check_system(system: Any) -> str | None:
    """`system`: a string or a list of text blocks (None when absent)."""
    if system is None or isinstance(system, str):
        if system:
            check_text(system, "system")
        return system
    if not isinstance(system, list):
        raise fail("system", f"must be a string or a list of text blocks, got {describe(system)}")
    return "\n\n".join(_text_block(b, f"system.{i}") for i, b in enumerate(system))


def check_conversation(system: Any, messages: Any) -> list[dict[str, Any]]:
    """The chat messages of `system` and `messages` (see the module docstring)."""
    text = check_system(system)
    out = [{"role": "system", "content": text}] if text is not None else []
    if not isinstance(messages, list) or not messages:
        raise fail("messages", "must be a non-empty list of messages")
    calls: set[str] = set()  # the tool_use ids of the assistant message just before
    for i, m in enumerate(messages):
        converted, calls = _message(m, f"messages.{i}", i, len(messages), calls)
        out += converted
    return out


def _message(m: Any, where: str, i: int, count: int,
             calls: set[str]) -> tuple[list[dict[str, Any]], set[str]]:
    """(chat messages, the tool_use ids the next message may answer) of message `i`."""
    if not isinstance(m, dict):
        raise fail(where, f"must be an object, got {describe(m)}")
    unknown = sorted(set(m) - {"role", "content"})
    if unknown:
        raise fail(f"{where}.{unknown[0]}", "unknown field")
    role = m.get("role")
    if role not in ROLES:
        raise fail(f"{where}.role", f"must be 'user' or 'assistant', got {describe(role)}")
    if role == "assistant" and i in (0, count - 1):
        which = "first" if i == 0 else "last"
        raise fail(f"{where}.role", f"the {which} message must be a user message (assistant "
                                    "prefill is not supported)")
    blocks = _blocks(m.get("content"), role, f"{where}.content")
    if role == "assistant":
        return [_assistant(blocks)], {b["id"] for b in blocks if b["type"] == "tool_use"}
    return _user(blocks, f"{where}.content", calls), set()


def _blocks(content: Any, role: str, where: str) -> list[dict[str, Any]]:
    """The content as checked blocks (a string is one text block)."""
    if isinstance(content, str):
        check_text(content, where)
        return [{"type": "text", "text": content}]
    if not isinstance(content, list):
        raise fail(where, f"must be a string or a list of content blocks, got {describe(content)}")
    return [_block(b, role, f"{where}.{j}") for j, b in enumerate(content)]


def _block(block: Any, role: str, where: str) -> dict[str, Any]:
    kind = block.get("type") if isinstance(block, dict) else None
    if not isinstance(block, dict) or not isinstance(kind, str):
        raise fail(f"{where}.type", "a content block must be an object with a string 'type'")
    if kind in UNSUPPORTED:
        raise fail(f"{where}.type", f"{kind} blocks are not supported by this server")
    if kind not in ROLE_BLOCKS[role]:
        allowed = ", ".join(ROLE_BLOCKS[role])
        raise fail(f"{where}.type", f"unknown block type {describe(kind)} in a {role} message "
                                    f"(allowed: {allowed})")
    unknown = sorted(k for k in block if k not in BLOCK_KEYS[kind])
    if unknown:
        raise fail(f"{where}.{unknown[0]}", "unknown field")
    if block.get("cache_control") is not None:
        check_value(block["cache_control"], f"{where}.cache_control")
    if kind == "text":
        return {"type": "text", "text": _text_block(block, where)}
    if kind == "tool_use":
        return _tool_use(block, where)
    return _tool_result(block, where)


def _string(block: dict[str, Any], key: str, where: str) -> str:
    value = block.get(key)
    if not isinstance(value, str):
        raise fail(f"{where}.{key}", f"must be a string, got {describe(value)}")
    check_text(value, f"{where}.{key}")
    return value


def _text_block(block: Any, where: str) -> str:
    if not isinstance(block, dict) or block.get("type") != "text":
        raise fail(f"{where}.type", "must be a text block {'type': 'text', 'text': ...}")
    unknown = sorted(k for k in block if k not in BLOCK_KEYS["text"])
    if unknown:
        raise fail(f"{where}.{unknown[0]}", "unknown field")
    return _string(block, "text", where)


def _tool_use(block: dict[str, Any], where: str) -> dict[str, Any]:
    call_id, name = _string(block, "id", where), _string(block, "name", where)
    args = block.get("input")
    if not isinstance(args, dict):
        raise fail(f"{where}.input", f"must be an object, got {describe(args)}")
    check_value(args, f"{where}.input")
    return {"type": "tool_use", "id": call_id, "name": name, "input": args}


def _tool_result(block: dict[str, Any], where: str) -> dict[str, Any]:
    call_id = _string(block, "tool_use_id", where)
    content = block.get("content")
    if content is None:
        text = ""
    elif isinstance(content, str):
        check_text(content, f"{where}.content")
        text = content
    elif isinstance(content, list):
        text = "\n\n".join(_text_block(b, f"{where}.content.{k}") for k, b in enumerate(content))
    else:
        raise fail(f"{where}.content", f"must be a string or a list of text blocks, got "
                                       f"{describe(content)}")
    is_error = block.get("is_error")
    if is_error is not None and not isinstance(is_error, bool):
        raise fail(f"{where}.is_error", f"must be a boolean, got {describe(is_error)}")
    # NOTE: the template has no field for a failed call; the model reads it in the text.
    return {"type": "tool_result", "id": call_id, "text": f"Error: {text}" if is_error else text}


def _assistant(blocks: list[dict[str, Any]]) -> dict[str, Any]:
    text = "\n\n".join(b["text"] for b in blocks if b["type"] == "text")
    calls = [{"id": b["id"], "type": "function",
              "function": {"name": b["name"], "arguments": b["input"]}}
             for b in blocks if b["type"] == "tool_use"]
    message: dict[str, Any] = {"role": "assistant", "content": text}
    if calls:
        message["tool_calls"] = calls
    return message


def _user(blocks: list[dict[str, Any]], where: str, calls: set[str]) -> list[dict[str, Any]]:
    """Tool results first (as tool messages, in their order), then the text as one message."""
    out = []
    for j, b in enumerate(blocks):
        if b["type"] == "tool_result":
            if b["id"] not in calls:
                raise fail(f"{where}.{j}.tool_use_id", f"{describe(b['id'])} answers no tool_use "
                                                       "block of the previous assistant message")
            out.append({"role": "tool", "content": b["text"], "tool_call_id": b["id"]})
    texts = [b["text"] for b in blocks if b["type"] == "text"]
    if texts or not out:
        out.append({"role": "user", "content": "\n\n".join(texts)})
    return out
