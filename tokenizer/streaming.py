"""The one wrapper every generating route goes through: errors, SSE, and abort.

    return await answer_generation(request, server, req, answer)

- `await pipeline.generate(tm, req)` checks everything first, so a bad request raises
  `InvalidRequest` (-> 400) before any response byte is sent.
- The updates are consumed inside `contextlib.aclosing`. NOTE: this is how a client that goes
  away aborts its request, in one place for every route and every state: aiohttp runs with
  `handler_cancellation=True`, so a disconnect cancels the handler task while it awaits the next
  update, or the next write raises `ConnectionResetError`; either way the iterator is closed and
  the manager's `finally` sends `AbortReq` for everything still running.
- An `Answer` folds the updates into its protocol's payloads: streamed, each update's payloads
  are sent as they come (`data: {json}`, named `event:` lines where the protocol wants them, a
  closing `done` line where it has one); not streamed, the same updates are folded and `final()`
  is the body. An error after the stream started becomes the protocol's own error event.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING, Any, Protocol

import orjson
from aiohttp import web

from tokenizer.core.events import Update
from tokenizer.core.pipeline import generate
from tokenizer.core.request import GenRequest
from tokenizer.errors import classify, error_body

if TYPE_CHECKING:
    from tokenizer.server_state import ServerState

logger = logging.getLogger("radixserve.http")

SSE_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache",
               "X-Accel-Buffering": "no"}
DONE_EVENT = b"data: [DONE]\n\n"


class Answer(Protocol):
    """How one protocol answers a generation from its event stream."""

    stream: bool
    named: bool  # SSE events carry `event: <type>` (Anthropic's, the Responses API's)
    done: bytes  # the stream's last line (OpenAI's and SGLang's [DONE]; none for the others)

    def start(self) -> list[Any]:
        """Payloads sent before the first update (chat's role deltas, message_start, ...)."""
        ...

    def update(self, update: Update) -> list[Any]:
        """Payloads for one update (and the update folded into the answer)."""
        ...

    def end(self) -> list[Any]:
        """Payloads sent after the last update (the usage chunk, ...)."""
        ...

    def final(self) -> Any:
        """The JSON body of a non-streamed answer."""
        ...

    def error_events(self, status: int, message: str, param: str | None) -> list[Any]:
        """An error after the stream started, as the protocol's events."""
        ...


def json_response(body: Any, status: int = 200) -> web.Response:
    return web.Response(status=status, body=orjson.dumps(body), content_type="application/json")


async def answer_generation(
    request: web.Request, server: ServerState, req: GenRequest, answer: Answer
) -> web.StreamResponse:
    """Start a generation and answer it, streamed or not; see the module docstring."""
    updates = await generate(server.accepting_manager(), req)
    return await respond(request, server, updates, answer)


async def respond(request: web.Request, server: ServerState, updates: AsyncIterator[Update],
                  answer: Answer) -> web.StreamResponse:
    """Answer a started generation (its updates are closed, and what runs aborted, at the end)."""
    with server.track():
        async with contextlib.aclosing(updates):  # type: ignore[type-var]
            if answer.stream:
                return await stream_updates(request, updates, answer)
            await fold(updates, answer)
            return json_response(answer.final())


async def fold(updates: AsyncIterator[Update], answer: Answer) -> None:
    """Every update into `answer` (a non-streamed generation)."""
    async for update in updates:
        answer.update(update)


async def stream_updates(request: web.Request, updates: AsyncIterator[Update], answer: Answer) -> web.StreamResponse:
    async def body(send: SendEvents) -> None:
        await send(answer.start())
        async for update in updates:
            await send(answer.update(update))
        await send(answer.end())

    return await sse_response(request, body, answer.error_events, named=answer.named, done=answer.done)


def openai_error_events(status: int, message: str, param: str | None) -> list[Any]:
    """An error after an OpenAI or native stream started: one error object."""
    return [error_body(status, message, param)]


SendEvents = Callable[[list[Any]], Awaitable[None]]


async def sse_response(
    request: web.Request, body: Callable[[SendEvents], Awaitable[None]],
    error_events: Callable[[int, str, str | None], list[Any]], *, named: bool = False, done: bytes = b"",
) -> web.StreamResponse:
    """The SSE skeleton every streaming route shares: `body` sends its events through the function
    it is given; an error raised after the headers went out is sent as the route's own error
    events; `done` (OpenAI's [DONE]) ends the stream. `named` events carry an `event: <type>`
    line (Anthropic's and the Responses API's clients need it). A client that goes away ends it
    quietly: the caller's `aclosing` aborts the request."""
    response = web.StreamResponse(headers=SSE_HEADERS)
    await response.prepare(request)

    async def send(payloads: list[Any]) -> None:
        if payloads:
            await response.write(b"".join(_sse_event(p, named) for p in payloads))

    try:
        try:
            await body(send)
        except ConnectionError:
            raise
        except Exception as exc:  # NOTE: headers are sent, so the error travels as an event
            status, message, param = classify(exc)
            if status == 500:
                logger.exception("error while streaming %s", request.path)
            await send(error_events(status, message, param))
        if done:
            await response.write(done)
        await response.write_eof()
    except ConnectionError:
        pass  # the client is gone; the caller's `aclosing` aborts the request
    return response


def _sse_event(payload: Any, named: bool) -> bytes:
    data = b"data: " + orjson.dumps(payload) + b"\n\n"
    return b"event: " + payload["type"].encode() + b"\n" + data if named else data
