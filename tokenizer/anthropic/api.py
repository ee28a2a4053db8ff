"""The Messages API routes' logic (the HTTP handlers in `tokenizer/http_server.py` call these):
parse the body, run it through the core, answer Anthropic's message or its event stream.

A bad body raises `InvalidRequest` before anything is sent (a 400 in Anthropic's shape,
`errors.py`), named as this API names its fields.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from aiohttp import web

from tokenizer.anthropic.messages import MessageAnswer, parse_count, parse_messages
from tokenizer.core.pipeline import render
from tokenizer.limits import check_prompt_chars
from tokenizer.streaming import answer_generation

if TYPE_CHECKING:
    from tokenizer.server_state import ServerState


async def create_message(request: web.Request, server: ServerState, body: Any, owner: str) -> web.StreamResponse:
    """POST /v1/messages."""
    parsed = parse_messages(body, server.config, server.model_name, owner)
    return await answer_generation(request, server, parsed.req, MessageAnswer(parsed))


async def count_tokens(server: ServerState, body: Any) -> dict[str, int]:
    """POST /v1/messages/count_tokens: the prompt's tokens, as a create would send them."""
    chat = parse_count(body)
    tm = server.accepting_manager()
    check_prompt_chars("messages", chat.chars(), tm.limits)
    rendered = await render(tm, chat)
    return {"input_tokens": len(rendered.ids)}
