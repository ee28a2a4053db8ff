"""The one wrapper every generating route goes through: validation errors, SSE, and abort.

    return await run_generation(request, server, body, renderer)

- `await TokenizerManager.generate(body)` validates everything first, so a bad request raises
  `InvalidRequest` (-> 400) before any response byte is sent.
- The results iterator is consumed inside `contextlib.aclosing`. NOTE: this is how a client that
  goes away aborts its request, in one place for every route and every state: aiohttp runs with
  `handler_cancellation=True`, so a disconnect cancels the handler task while it awaits the next
  result, or the next write raises `ConnectionResetError`; either way the generator is closed and
  the manager's `finally` sends `AbortReq` for everything still running.
- Streams are SSE: `data: {json}\\n\\n` per payload, always ending with `data: [DONE]\\n\\n`. An
  error after the stream started becomes one `data: {"error": {...}}` event before [DONE].

A `Renderer` turns the manager's SGLang-shaped outputs into a route's payloads (native /generate
passes them through; the OpenAI routes build completions and chat chunks).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING, Any, Protocol

import orjson
from aiohttp import web

from runtime.contracts.errors import InvalidRequest
from tokenizer.errors import classify, error_body

if TYPE_CHECKING:
    from tokenizer.server_state import ServerState

logger = logging.getLogger("radixserve.http")

SSE_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache",
               "X-Accel-Buffering": "no"}
DONE_EVENT = b"data: [DONE]\n\n"


class Renderer(Protocol):
    """How one route presents the manager's outputs."""

    stream: bool

    def translate(self, exc: InvalidRequest) -> InvalidRequest:
        """Rename the manager's field names to the route's (e.g. max_new_tokens -> max_tokens)."""
        ...

    def final(self, result: Any) -> Any:
        """The JSON body of a non-streamed response."""
        ...

    def start(self) -> list[Any]:
        """Payloads sent before the first output (e.g. chat's role deltas)."""
        ...

    def chunks(self, out: dict[str, Any]) -> list[Any]:
        """Payloads for one streamed output (cumulative, tagged with "index" when fanned out)."""
        ...

    def end(self) -> list[Any]:
        """Payloads sent after the last output (e.g. the usage chunk)."""
        ...


def json_response(body: Any, status: int = 200) -> web.Response:
    return web.Response(status=status, body=orjson.dumps(body), content_type="application/json")


async def run_generation(
    request: web.Request, server: ServerState, body: dict[str, Any], renderer: Renderer
) -> web.StreamResponse:
    """Start a generation and answer it, streamed or not; see the module docstring."""
    tm = server.accepting_manager()
    try:
        results = await tm.generate(body)
    except InvalidRequest as exc:
        raise renderer.translate(exc) from None
    with server.track():
        async with contextlib.aclosing(results):  # type: ignore[type-var]
            if renderer.stream:
                return await _stream(request, results, renderer)
            return json_response(renderer.final(await last_result(results)))


async def last_result(results: AsyncIterator[Any]) -> Any:
    """The one (final) result of a non-streamed generation."""
    final = None
    async for out in results:
        final = out
    return final


async def _stream(
    request: web.Request, results: AsyncIterator[Any], renderer: Renderer
) -> web.StreamResponse:
    async def body(send: SendEvents) -> None:
        await send(renderer.start())
        async for out in results:
            await send(renderer.chunks(out))
        await send(renderer.end())

    return await sse_response(request, body, lambda status, message, param: [error_body(status, message, param)],
                              done=DONE_EVENT)


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
