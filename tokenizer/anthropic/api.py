"""The Messages API routes' logic (the HTTP handlers in `tokenizer/http_server.py` call these):
check the body, render the chat template off the event loop (the chat route's
`chat_prompt_ids`), run the generation and answer Anthropic's message or its event stream.

A bad body raises `InvalidRequest` before anything is sent (a 400 in Anthropic's shape,
`errors.py`); the manager's own checks (context length, sampling ranges, the tool grammar) are
renamed to this API's fields (`request.translate`).
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any

from aiohttp import web

from runtime.contracts.errors import InvalidRequest
from tokenizer.anthropic.events import MessageEvents, final_message
from tokenizer.anthropic.request import Conversation, check_count, check_messages, translate
from tokenizer.anthropic.stream import stream_events
from tokenizer.openai.api import chat_prompt_ids
from tokenizer.openai.protocol import ChatPrompt
from tokenizer.streaming import json_response, last_result

if TYPE_CHECKING:
    from tokenizer.manager import TokenizerManager
    from tokenizer.server_state import ServerState


async def prompt_ids(tm: TokenizerManager, conversation: Conversation) -> list[int]:
    """The rendered prompt's token ids, as the chat route renders them (tools included)."""
    plan = conversation.tools.plan
    tools = plan.as_openai_tools() if plan is not None else None
    return await chat_prompt_ids(tm, ChatPrompt(conversation.messages, {}, tools))


async def create_message(request: web.Request, server: ServerState, req: Any) -> web.StreamResponse:
    """POST /v1/messages."""
    plan = check_messages(req)
    tm = server.accepting_manager()
    ids = await prompt_ids(tm, plan.conversation)
    body = {"input_ids": ids, "sampling_params": plan.sampling, "stream": plan.stream,
            "rid": plan.rid}
    try:
        results = await tm.generate(body)
    except InvalidRequest as exc:
        raise translate(exc) from None
    parser = server.config.tool_call_parser
    with server.track():
        async with contextlib.aclosing(results):  # type: ignore[type-var]
            if plan.stream:
                events = MessageEvents(plan, server.model_name, parser)
                return await stream_events(request, results, events)
            out = await last_result(results)
            return json_response(final_message(plan, server.model_name, out, parser))


async def count_tokens(server: ServerState, req: Any) -> dict[str, int]:
    """POST /v1/messages/count_tokens: the prompt's tokens, as a create would send them."""
    conversation = check_count(req)
    ids = await prompt_ids(server.accepting_manager(), conversation)
    return {"input_tokens": len(ids)}
