"""The /v1/responses routes' logic (the aiohttp handlers in http_server.py call these).

    POST   /v1/responses                 create (stream: true -> typed SSE events, `answer.py`)
    GET    /v1/responses/{id}            a stored response, or a running one (in_progress)
    DELETE /v1/responses/{id}            forget a stored response
    POST   /v1/responses/{id}/cancel     abort a running response; it ends with status cancelled

A create renders the previous response's history (from the store) and the new items with the
chat template, so the history is a token prefix of the new prompt and the radix cache serves it
(usage.input_tokens_details.cached_tokens). The response's rid is its id: `cancel` (and
/abort_request, by the same owner) abort it by that label. Ownership (`store.owner_key`): the API
key the client presented and its cache salt (cache_salt or extra_key in the body; in the query
string for GET, DELETE and cancel); another owner gets the 404 a missing id gets.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any

from aiohttp import web

from runtime.contracts.errors import InvalidRequest
from tokenizer.core.pipeline import generate
from tokenizer.errors import HTTPError
from tokenizer.openai.responses import output
from tokenizer.openai.responses.answer import ResponseAnswer
from tokenizer.openai.responses.request import ResponseRequest, parse_response
from tokenizer.openai.responses.store import ResponseStore, Running
from tokenizer.owner import request_owner
from tokenizer.streaming import fold, json_response, stream_updates

if TYPE_CHECKING:
    from runtime.contracts.config import ServerConfig
    from tokenizer.server_state import ServerState

STORE: web.AppKey[ResponseStore] = web.AppKey("responses_store", ResponseStore)


def attach_store(app: web.Application, config: ServerConfig) -> None:
    """The app's response store, bounded by the --responses-store-* flags."""
    app[STORE] = ResponseStore(config.responses_store_max_count, config.responses_store_max_bytes,
                               config.responses_store_ttl)


def _owner(request: web.Request, salt: str | None) -> str:
    return request_owner(request.headers, salt)


def _query_owner(request: web.Request) -> str:
    """The owner of a GET, DELETE or cancel: the key, and the salt from the query string."""
    given = [request.query.get(k) for k in ("cache_salt", "extra_key")]
    salt = "\x00".join(k for k in given if k) or None
    return _owner(request, salt)


def _not_found(rid: str, param: str | None = None) -> HTTPError:
    return HTTPError(404, f"Response with id '{rid[:64]}' not found.", param=param)


async def create(request: web.Request, server: ServerState, body: Any) -> web.StreamResponse:
    """POST /v1/responses; see the module docstring."""
    tm = server.accepting_manager()
    parsed = parse_response(body, server.config, request_owner(request.headers))
    store, owner = request.app[STORE], _owner(request, parsed.salt)
    history: list[dict[str, Any]] = []
    if parsed.previous_response_id is not None:
        previous = store.get(parsed.previous_response_id, owner)
        if previous is None:
            raise _not_found(parsed.previous_response_id, "previous_response_id")
        history = previous.history
    rid = output.new_id("resp_")
    updates = await generate(tm, parsed.request(history, rid))
    answer = ResponseAnswer(output.new_response(rid, server.model_name, parsed.echo), parsed.template.stream)
    running = store.start(rid, owner, answer.response)
    try:
        with server.track():
            async with contextlib.aclosing(updates):  # type: ignore[type-var]
                if answer.stream:
                    saving = _Saving(answer, running, parsed, history, store, owner)
                    return await stream_updates(request, updates, saving)
                await fold(updates, answer)
                answer.cancelled = running.cancelled
                final = answer.final()
    finally:
        store.finish(rid)
    save(parsed, history, store, owner, final)
    return json_response(final)


def save(parsed: ResponseRequest, history: list[dict[str, Any]], store: ResponseStore, owner: str,
         final: dict[str, Any]) -> None:
    """Keep a finished response when asked (store: true), with the conversation it ends."""
    if parsed.store and final["status"] != "failed":
        store.put(final["id"], owner, final, history + parsed.items + output.history_items(final["output"]))


class _Saving:
    """A streamed answer that stores the response before its terminal event."""

    def __init__(self, answer: ResponseAnswer, running: Running, parsed: ResponseRequest,
                 history: list[dict[str, Any]], store: ResponseStore, owner: str) -> None:
        self.answer, self.running, self.parsed = answer, running, parsed
        self.history, self.store, self.owner = history, store, owner
        self.stream, self.named, self.done = True, True, b""

    def start(self) -> list[Any]:
        return self.answer.start()

    def update(self, update: Any) -> list[Any]:
        self.answer.cancelled = self.running.cancelled
        return self.answer.update(update)

    def end(self) -> list[Any]:
        final = self.answer.final()
        save(self.parsed, self.history, self.store, self.owner, final)
        return self.answer.end()

    def final(self) -> Any:
        return self.answer.final()

    def error_events(self, status: int, message: str, param: str | None) -> list[Any]:
        return self.answer.error_events(status, message, param)


def retrieve(request: web.Request) -> dict[str, Any]:
    """GET /v1/responses/{id}: the stored response, or a running one's snapshot."""
    rid, owner = request.match_info["response_id"], _query_owner(request)
    store = request.app[STORE]
    running = store.running(rid, owner)
    if running is not None:
        return running.snapshot
    stored = store.get(rid, owner)
    if stored is None:
        raise _not_found(rid)
    return stored.response


def delete(request: web.Request) -> dict[str, Any]:
    rid = request.match_info["response_id"]
    if not request.app[STORE].delete(rid, _query_owner(request)):
        raise _not_found(rid)
    return {"id": rid, "object": "response.deleted", "deleted": True}


async def cancel(request: web.Request, server: ServerState) -> dict[str, Any]:
    """POST /v1/responses/{id}/cancel: abort a running response (it ends cancelled)."""
    rid, owner = request.match_info["response_id"], _query_owner(request)
    store = request.app[STORE]
    running = store.running(rid, owner)
    if running is None:
        if store.get(rid, owner) is None:
            raise _not_found(rid)
        raise InvalidRequest(f"Response '{rid}' is not in progress; only a running response can be cancelled.")
    running.cancelled = True
    await server.manager().abort(rid)
    return {**running.snapshot, "status": "cancelled"}
