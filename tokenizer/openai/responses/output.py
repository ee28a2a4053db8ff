"""Response objects and output items of /v1/responses (pure; `answer.py` decides which items an
output makes: a `reasoning` item when the server's reasoning parser found thinking text, a
`message` item with one `output_text` part for content, or when there is nothing else, and a
`function_call` item per call, in the order they were generated). Status:

    finish stop                 -> completed
    finish length               -> incomplete, incomplete_details {reason: max_output_tokens}
    finish abort after cancel   -> cancelled
    finish abort otherwise      -> failed, error {code: server_error} (a deadline, a shutdown)

Every id is the server's own random string (resp_, msg_, fc_, rs_; call_ from tool_calls.py).
"""

from __future__ import annotations

import secrets
import time
from typing import Any

from tokenizer.core.events import Usage


def new_id(prefix: str) -> str:
    """A fresh id such as resp_3f...: 128 random bits, so ids cannot be guessed."""
    return prefix + secrets.token_hex(16)


def reasoning_item(item_id: str, text: str, status: str = "completed") -> dict[str, Any]:
    return {"type": "reasoning", "id": item_id, "summary": [], "status": status,
            "content": [{"type": "reasoning_text", "text": text}]}


def message_item(item_id: str, text: str | None, status: str = "completed") -> dict[str, Any]:
    """A message; `text` None: just opened, no content part yet (a stream's first event)."""
    content = [] if text is None else [text_part(text)]
    return {"type": "message", "id": item_id, "status": status, "role": "assistant", "content": content}


def text_part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def call_item(item_id: str, call_id: str, name: str, arguments: str, status: str = "completed") -> dict[str, Any]:
    return {"type": "function_call", "id": item_id, "call_id": call_id, "name": name, "arguments": arguments,
            "status": status}


def history_items(output: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Output items in the plain input form (`items.py`) that a continuation renders."""
    plain = []
    for item in output:
        if item["type"] == "message":
            text = "".join(part["text"] for part in item["content"])
            plain.append({"type": "message", "role": "assistant", "content": text})
        elif item["type"] == "function_call":
            plain.append({"type": "function_call", "call_id": item["call_id"], "name": item["name"],
                          "arguments": item["arguments"]})
    return plain


def new_response(rid: str, model: str, echo: dict[str, Any]) -> dict[str, Any]:
    """The response object as it starts: in progress, no output yet."""
    return {"id": rid, "object": "response", "created_at": int(time.time()), "status": "in_progress",
            "error": None, "incomplete_details": None, "model": model, "output": [], "usage": None, **echo}


def usage(u: Usage) -> dict[str, Any]:
    prompt, completion = u.prompt_tokens, u.completion_tokens
    return {"input_tokens": prompt, "input_tokens_details": {"cached_tokens": u.cached_tokens},
            "output_tokens": completion, "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": prompt + completion}


def final_status(detail: dict[str, Any], cancelled: bool) -> tuple[str, dict[str, Any]]:
    """(status, the fields that come with it) for a finished generation."""
    kind = detail.get("type")
    if kind == "length":
        return "incomplete", {"incomplete_details": {"reason": "max_output_tokens"}}
    if kind == "abort":
        if cancelled:
            return "cancelled", {}
        message = str(detail.get("message") or "the generation was aborted")
        return "failed", {"error": {"code": "server_error", "message": message}}
    return "completed", {}


def finished(response: dict[str, Any], output: list[dict[str, Any]], detail: dict[str, Any], u: Usage,
             cancelled: bool) -> dict[str, Any]:
    """The response object once its generation ended."""
    status, extra = final_status(detail, cancelled)
    return {**response, "status": status, **extra, "output": list(output), "usage": usage(u),
            "completed_at": int(time.time()) if status == "completed" else None}
