"""What a message says beside its content: stop_reason, usage and the message object (shared by
the plain answer and the stream; the content blocks come from `events.py`).

    stop_reason   max_tokens     max_tokens reached (a call it cut short included)
                  tool_use       the output holds tool calls (read by `openai/tool_calls.py`)
                  stop_sequence  a `stop_sequences` entry ended it (`stop_sequence` names it)
                  end_turn       the model's end-of-turn (EOS) token
                  pause_turn     cut short by the server (a deadline, /abort_request): the turn
                                 may be sent back to continue, as with Anthropic's pause_turn
    usage         input_tokens + cache_read_input_tokens = the prompt's tokens (Anthropic's
                  split: input_tokens excludes what the cache served); the radix cache reuses
                  prefixes by itself, so cache_creation_input_tokens is always 0.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

from tokenizer.anthropic.request import MessagesPlan


@dataclass(frozen=True, slots=True)
class Stop:
    reason: str
    sequence: str | None = None


def new_tool_id() -> str:
    """A tool_use id in Anthropic's form (the client sends it back in its tool_result)."""
    return "toolu_" + uuid.uuid4().hex[:24]


def stop_of(plan: MessagesPlan, meta: dict[str, Any], has_calls: bool) -> Stop:
    """stop_reason and stop_sequence of a finished output (see the module docstring)."""
    finish = meta.get("finish_reason") or {}
    kind, matched = finish.get("type"), finish.get("matched")
    if kind == "length":
        return Stop("max_tokens")
    if has_calls:
        return Stop("tool_use")
    if kind == "stop" and isinstance(matched, str) and matched in plan.stop_sequences:
        return Stop("stop_sequence", matched)
    return Stop("end_turn" if kind == "stop" else "pause_turn")


def usage(meta: dict[str, Any]) -> dict[str, int]:
    cached = int(meta.get("cached_tokens") or 0)
    return {"input_tokens": int(meta["prompt_tokens"]) - cached,
            "output_tokens": int(meta["completion_tokens"]),
            "cache_creation_input_tokens": 0, "cache_read_input_tokens": cached}


def message_body(plan: MessagesPlan, model: str, content: list[dict[str, Any]],
                 stop: Stop | None, meta: dict[str, Any]) -> dict[str, Any]:
    """A message object (a stream's message_start has no content and no stop yet)."""
    return {"id": plan.id, "type": "message", "role": "assistant", "model": model,
            "content": content, "stop_reason": stop.reason if stop else None,
            "stop_sequence": stop.sequence if stop else None, "usage": usage(meta)}
