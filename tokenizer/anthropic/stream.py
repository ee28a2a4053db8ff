"""Anthropic's event stream over SSE for `stream: true` (the events: `events.py`).

Each event is `event: <type>` + `data: <json>`: the `anthropic` client drops an event without its
name. An error after the stream started is one `error` event, and the stream ends (no [DONE]:
Anthropic sends none).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from typing import Any

import orjson
from aiohttp import web

from tokenizer.anthropic.errors import anthropic_error
from tokenizer.anthropic.events import Event, MessageEvents
from tokenizer.errors import classify
from tokenizer.streaming import SSE_HEADERS

logger = logging.getLogger("radixserve.http")


async def stream_events(request: web.Request, results: AsyncIterator[Any],
                        events: MessageEvents) -> web.StreamResponse:
    """Send the events of `results` as SSE. NOTE: as in `tokenizer.streaming`, a client that
    goes away raises here or cancels the task, and the caller's `aclosing` aborts the request."""
    response = web.StreamResponse(headers=SSE_HEADERS)
    await response.prepare(request)
    try:
        try:
            async for out in results:
                await _send(response, events.feed(out))
        except ConnectionError:
            raise
        except Exception as exc:  # NOTE: headers are sent, so the error travels as an event
            status, message, param = classify(exc)
            if status == 500:
                logger.exception("error while streaming %s", request.path)
            await _send(response, [anthropic_error(status, message, param)])
        await response.write_eof()
    except ConnectionError:
        pass  # the client is gone
    return response


async def _send(response: web.StreamResponse, events: list[Event]) -> None:
    if events:
        await response.write(b"".join(
            b"event: " + e["type"].encode() + b"\ndata: " + orjson.dumps(e) + b"\n\n" for e in events))
