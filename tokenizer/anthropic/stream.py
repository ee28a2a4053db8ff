"""Anthropic's event stream over SSE for `stream: true` (the events: `events.py`).

Each event is `event: <type>` + `data: <json>`: the `anthropic` client drops an event without its
name. An error after the stream started is one `error` event, and the stream ends (no [DONE]:
Anthropic sends none).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from aiohttp import web

from tokenizer.anthropic.errors import anthropic_error
from tokenizer.anthropic.events import MessageEvents
from tokenizer.streaming import SendEvents, sse_response


async def stream_events(request: web.Request, results: AsyncIterator[Any],
                        events: MessageEvents) -> web.StreamResponse:
    """Send the events of `results` as named SSE events (`tokenizer.streaming.sse_response`)."""

    async def body(send: SendEvents) -> None:
        async for out in results:
            await send(events.feed(out))

    return await sse_response(request, body, lambda status, message, param: [anthropic_error(status, message, param)],
                              named=True)
