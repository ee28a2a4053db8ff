"""The /v1/responses routes' logic (the aiohttp handlers in http_server.py call these).

    POST   /v1/responses                 create (stream: true -> typed SSE events, `events.py`)
    GET    /v1/responses/{id}            a stored response, or a running one (in_progress)
    DELETE /v1/responses/{id}            forget a stored response
    POST   /v1/responses/{id}/cancel     abort a running response; it ends with status cancelled

A create runs the chat pipeline: the previous response's history (from the store) and the new
items become messages, rendered by the chat template, so the history is a token prefix of the
new prompt and the radix cache serves it (usage.input_tokens_details.cached_tokens). The
response's rid is its id: `cancel` (and /abort_request) abort it by that label. Ownership
(`store.owner_key`): the API key the client presented and its cache salt (cache_salt or extra_key
in the body; in the query string for GET, DELETE and cancel); another owner gets the 404 a
missing id gets.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from aiohttp import web

from runtime.contracts.errors import InvalidRequest
from tokenizer.errors import HTTPError
from tokenizer.openai.api import plan_chat_request
from tokenizer.openai.protocol import OpenAIPlan, cache_key, translate
from tokenizer.openai.reasoning import PARSERS as REASONING_PARSERS
from tokenizer.openai.reasoning import ReasoningFormat
from tokenizer.openai.responses import output
from tokenizer.openai.responses.events import ResponseEvents, items_of
from tokenizer.openai.responses.protocol import ResponseRequest, check_response, rename_error
from tokenizer.openai.responses.store import ResponseStore, Running, owner_key
from tokenizer.streaming import SendEvents, json_response, last_result, sse_response

if TYPE_CHECKING:
    from runtime.contracts.config import ServerConfig
    from tokenizer.server_state import ServerState

logger = logging.getLogger("radixserve.http")
STORE: web.AppKey[ResponseStore] = web.AppKey("responses_store", ResponseStore)


def attach_store(app: web.Application, config: ServerConfig) -> None:
    """The app's response store, bounded by the --responses-store-* flags."""
    app[STORE] = ResponseStore(config.responses_store_max_count, config.responses_store_max_bytes,
                               config.responses_store_ttl)


def _owner(request: web.Request, salt: str | None) -> str:
    return owner_key(request.headers.get("Authorization", ""), salt)


def _query_owner(request: web.Request) -> str:
    """The owner of a GET, DELETE or cancel: the key, and the salt from the query string."""
    return _owner(request, cache_key(dict(request.query)))


def _not_found(rid: str, param: str | None = None) -> HTTPError:
    return HTTPError(404, f"Response with id '{rid[:64]}' not found.", param=param)


async def create(request: web.Request, server: ServerState, body: Any) -> web.StreamResponse:
    """POST /v1/responses; see the module docstring."""
    tm = server.accepting_manager()
    config = server.config
    req = check_response(body, config.reasoning_parser != "none")
    store, owner = request.app[STORE], _owner(request, req.salt)
    history: list[dict[str, Any]] = []
    if req.previous_response_id is not None:
        previous = store.get(req.previous_response_id, owner)
        if previous is None:
            raise _not_found(req.previous_response_id, "previous_response_id")
        history = previous.history
    rid = output.new_id("resp_")
    chat = {**req.chat_request(history), "rid": rid}
    try:
        plan = await plan_chat_request(tm, config, chat, server.model_name)
    except InvalidRequest as exc:
        raise rename_error(exc) from None
    try:
        results = await tm.generate(plan.body)
    except InvalidRequest as exc:  # the manager's names: max_new_tokens, json_schema, ...
        raise rename_error(translate(exc, "chat", plan.renames)) from None
    run = _Run(req, plan, output.new_response(rid, server.model_name, req.echo), history, config)
    running = store.start(rid, owner, run.response)
    try:
        with server.track():
            async with contextlib.aclosing(results):  # type: ignore[type-var]
                if req.stream:
                    return await _stream(request, run, running, results, store, owner)
                final = run.finish(await last_result(results), running.cancelled)
    finally:
        store.finish(rid)
    run.save(store, owner, final)
    return json_response(final)


class _Run:
    """One create's parameters: how to parse the output and what to store."""

    def __init__(self, req: ResponseRequest, plan: OpenAIPlan, response: dict[str, Any],
                 history: list[dict[str, Any]], config: ServerConfig) -> None:
        self.req, self.plan, self.response, self.history = req, plan, response, history
        self.tool_parser = config.tool_call_parser
        fmt = REASONING_PARSERS.get(config.reasoning_parser) if plan.separate_reasoning else None
        self.reasoning: ReasoningFormat | None = fmt

    def finish(self, out: dict[str, Any], cancelled: bool) -> dict[str, Any]:
        meta = out["meta_info"]
        items = items_of(out["text"], output.item_status(meta), self.reasoning, self.plan.tools, self.tool_parser)
        return output.finished(self.response, items, meta, cancelled)

    def events(self) -> ResponseEvents:
        return ResponseEvents(self.response, self.reasoning, self.plan.tools, self.tool_parser)

    def save(self, store: ResponseStore, owner: str, final: dict[str, Any]) -> None:
        """Keep a finished response when asked (store: true), with the conversation it ends."""
        if self.req.store and final["status"] != "failed":
            history = self.history + self.req.items + output.history_items(final["output"])
            store.put(final["id"], owner, final, history)


async def _stream(request: web.Request, run: _Run, running: Running, results: AsyncIterator[Any],
                  store: ResponseStore, owner: str) -> web.StreamResponse:
    events = run.events()

    async def body(send: SendEvents) -> None:
        await send(events.start())
        final = None
        async for out in results:
            meta = out["meta_info"]
            done = meta.get("finish_reason") is not None
            await send(events.feed(out["text"], done, output.item_status(meta)))
            if done:
                final = output.finished(run.response, events.items, meta, running.cancelled)
        if final is not None:
            run.save(store, owner, final)
            await send(events.end(final))

    def error(status: int, message: str, param: str | None) -> list[dict[str, Any]]:
        return [events.event("error", code=str(status), message=message, param=param)]

    return await sse_response(request, body, error, named=True)


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
