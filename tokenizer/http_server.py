"""The HTTP server: the aiohttp app (routes only: HTTP in, HTTP out) and `serve(config)`.

    radixserve serve --port 30000 ...        (or: python -m tokenizer.http_server --port 30000)

Native (SGLang):  POST /generate, GET /health, GET /health_generate, GET /get_model_info,
                  GET /get_server_info, GET /get_load, POST /flush_cache, POST /abort_request, GET /metrics,
                  POST /tokenize, POST /detokenize (also under /v1/)
OpenAI:           GET /v1/models, POST /v1/completions, POST /v1/chat/completions,
                  POST /v1/responses, GET|DELETE /v1/responses/{id}, POST /v1/responses/{id}/cancel,
                  POST /v1/embeddings
Rerank and score: POST /v1/rerank (Cohere's and Jina's shape), POST /v1/score (vLLM's)
Anthropic:        POST /v1/messages, POST /v1/messages/count_tokens (errors in Anthropic's shape)
OpenAPI:          GET /openapi.json (every route's body, from the field specs, and answers)

Every body is parsed by its protocol's field spec into the one typed request
(`tokenizer/core/`), and every generating route answers through `streaming.answer_generation`
(the core's event stream, SSE, abort on disconnect); every error is an OpenAI error object
(`errors.error_middleware`; Anthropic's on its routes); `browser_guard` refuses foreign web pages
(Origin, Host, Sec-Fetch) on every route before anything else; with an API key
(`api_key.resolve_api_key`), `errors.auth_middleware` guards every route but /health. The process
lifecycle is in lifecycle.py.
"""

from __future__ import annotations

import sys
from typing import Any

import orjson
from aiohttp import web

from runtime.contracts.config import ServerConfig
from runtime.contracts.errors import InvalidRequest
from tokenizer import browser_guard, embed_routes, native_api, openapi, token_routes
from tokenizer.anthropic import api as anthropic_api
from tokenizer.anthropic.errors import error_shape_middleware
from tokenizer.api_key import resolve_api_key
from tokenizer.core.pipeline import generate as generate_updates
from tokenizer.errors import Handler, HTTPError, auth_middleware, error_middleware, error_response
from tokenizer.metrics import CONTENT_TYPE
from tokenizer.native.generate import NativeAnswer, parse_generate
from tokenizer.openai.chat import ChatAnswer, parse_chat
from tokenizer.openai.completions import CompletionAnswer, CompletionRequest, parse_completion
from tokenizer.openai.responses import api as responses_api
from tokenizer.owner import request_owner
from tokenizer.server_state import Phase, ServerState
from tokenizer.streaming import answer_generation, json_response, respond

SERVER: web.AppKey[ServerState] = web.AppKey("server", ServerState)


def create_app(server: ServerState) -> web.Application:
    """The aiohttp application for one server (its own metrics registry included)."""
    guard = browser_guard.BrowserGuard.from_config(server.config)
    # NOTE: the browser guard runs before auth and readiness, and before any body is read.
    middlewares: list[Any] = [_count_middleware(server), error_shape_middleware(), error_middleware,
                              browser_guard.guard_middleware(guard)]
    if server.config.api_key:
        middlewares.append(auth_middleware(server.config.api_key))
    middlewares.append(_readiness_middleware(server))
    app = web.Application(client_max_size=server.config.max_request_bytes, middlewares=middlewares)
    app[SERVER] = server
    responses_api.attach_store(app, server.config)
    app.on_response_prepare.append(browser_guard.cors_hook(guard))
    app.add_routes([
        web.post("/generate", generate), web.put("/generate", generate),
        web.get("/health", health), web.get("/health_generate", health_generate),
        web.get("/get_model_info", get_model_info), web.get("/get_server_info", get_server_info),
        web.get("/model_info", get_model_info), web.get("/server_info", get_server_info),  # SGLang's newer names
        web.get("/get_load", get_load),  # sglang-router's load monitor reads it
        web.post("/tokenize", tokenize), web.post("/detokenize", detokenize),
        web.post("/v1/tokenize", tokenize), web.post("/v1/detokenize", detokenize),
        web.post("/flush_cache", flush_cache),
        web.post("/abort_request", abort_request), web.get("/metrics", metrics),
        web.get("/v1/models", list_models), web.post("/v1/completions", completions),
        web.post("/v1/chat/completions", chat_completions),
        web.post("/v1/responses", create_response), web.get("/v1/responses/{response_id}", get_response),
        web.delete("/v1/responses/{response_id}", delete_response),
        web.post("/v1/responses/{response_id}/cancel", cancel_response),
        web.post("/v1/messages", messages), web.post("/v1/messages/count_tokens", count_tokens),
        web.post("/v1/embeddings", embeddings), web.post("/v1/rerank", rerank), web.post("/v1/score", score),
        web.get("/openapi.json", openapi_document),
    ])
    return app


def _count_middleware(server: ServerState) -> Any:
    """Count every request by route and final status (499: the client went away)."""

    @web.middleware
    async def count(request: web.Request, handler: Handler) -> web.StreamResponse:
        resource = request.match_info.route.resource
        route = resource.canonical if resource is not None else "unmatched"
        status = 499
        try:
            response = await handler(request)
            status = response.status
            return response
        finally:
            server.metrics.observe_http(request.method, route, status)

    return count


def _readiness_middleware(server: ServerState) -> Any:
    """Until the runtime is up every route answers 503 with Retry-After, so a client polling any
    of them (`/v1/models`, as benchmark clients do) starts only when generations can run."""

    @web.middleware
    async def ready(request: web.Request, handler: Handler) -> web.StreamResponse:
        if server.phase is Phase.STARTING:
            raise HTTPError(503, "The server is starting; retry when /health returns 200.")
        return await handler(request)

    return ready


# application/octet-stream: what aiohttp reports for a missing type, and what raw-bytes clients send.
UNTYPED_BODY = "application/octet-stream"


def _is_json(media_type: str) -> bool:
    return media_type in ("application/json", UNTYPED_BODY) or (
        media_type.startswith("application/") and media_type.endswith("+json"))


async def _json_body(request: web.Request) -> Any:
    """The parsed JSON body; 413 over the size limit (checked before reading when announced),
    415 for a body that says it is not JSON (a web page's `text/plain` or form POST, which a
    browser sends cross-site without asking: refused, so a key-less local server is not a CSRF
    target). A body without a type (or typed as raw bytes) is read as JSON, for curl without -H
    and raw clients; a page can send one too (a Blob), but with an Origin that `browser_guard`
    has refused already unless --allowed-origins lets that page in."""
    if not _is_json(request.content_type):
        raise HTTPError(415, f"Content-Type {request.content_type} is not supported here; send a JSON body "
                             "with Content-Type: application/json.")
    limit = request.app[SERVER].config.max_request_bytes
    if request.content_length is not None and request.content_length > limit:
        raise HTTPError(413, f"The request body ({request.content_length} bytes) is larger than "
                             f"the limit of {limit} bytes.")
    raw = await request.read()
    if not raw:
        raise InvalidRequest("the request body is empty; send a JSON object")
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise InvalidRequest(f"the request body is not valid JSON: {exc}") from None


# ---------------------------------------------------------------- native


def _owner(request: web.Request) -> str:
    return request_owner(request.headers)


async def generate(request: web.Request) -> web.StreamResponse:
    req = parse_generate(await _json_body(request), _owner(request))
    return await answer_generation(request, request.app[SERVER], req, NativeAnswer(req))


async def health(request: web.Request) -> web.StreamResponse:
    server = request.app[SERVER]
    if server.healthy:
        return web.Response(status=200)
    reason = server.dead_reason if server.phase is Phase.DEAD else None
    suffix = f": {reason}" if reason else "."
    return error_response(503, f"The server is {server.phase.value}{suffix}")


async def health_generate(request: web.Request) -> web.StreamResponse:
    if await native_api.health_generate(request.app[SERVER]):
        return web.Response(status=200)
    return error_response(503, "The health-check generation did not finish in time.")


async def get_model_info(request: web.Request) -> web.StreamResponse:
    return json_response(native_api.model_info(request.app[SERVER]))


async def get_server_info(request: web.Request) -> web.StreamResponse:
    return json_response(await native_api.server_info(request.app[SERVER]))


async def get_load(request: web.Request) -> web.StreamResponse:
    return json_response(await native_api.load(request.app[SERVER]))


async def tokenize(request: web.Request) -> web.StreamResponse:
    return json_response(await token_routes.tokenize(request.app[SERVER], await _json_body(request)))


async def detokenize(request: web.Request) -> web.StreamResponse:
    return json_response(await token_routes.detokenize(request.app[SERVER], await _json_body(request)))


async def flush_cache(request: web.Request) -> web.StreamResponse:
    if await request.app[SERVER].manager().flush_cache():
        return web.Response(text="Cache flushed.")
    return error_response(400, "Cache not flushed: requests are running or waiting.")


async def abort_request(request: web.Request) -> web.StreamResponse:
    body = await _json_body(request)
    return json_response(await native_api.abort_request(request.app[SERVER], body, _owner(request)))


async def metrics(request: web.Request) -> web.StreamResponse:
    server = request.app[SERVER]
    await server.refresh_gauges()
    return web.Response(body=server.metrics.render(), headers={"Content-Type": CONTENT_TYPE})


# ---------------------------------------------------------------- OpenAI


async def list_models(request: web.Request) -> web.StreamResponse:
    server = request.app[SERVER]
    card = {"id": server.model_name, "object": "model", "created": server.created, "owned_by": "radixserve",
            "root": server.model_name, "max_model_len": server.config.context_length}
    return json_response({"object": "list", "data": [card]})


async def completions(request: web.Request) -> web.StreamResponse:
    server = request.app[SERVER]
    parsed = parse_completion(await _json_body(request), server.model_name, _owner(request))
    updates = await generate_updates(server.accepting_manager(), parsed.req)
    try:
        parsed.echo_texts = await echo_texts(server, parsed)
    except BaseException:
        await updates.aclose()  # type: ignore[attr-defined]
        raise
    return await respond(request, server, updates, CompletionAnswer(parsed))


async def echo_texts(server: ServerState, parsed: CompletionRequest) -> list[str]:
    """Each prompt's text for `echo` (id prompts decoded: the manager has checked them)."""
    if parsed.echo is None:
        return []
    ids = [p for p in parsed.echo if not isinstance(p, str)]
    texts = iter(await server.manager().encoder.decode(ids))
    return [p if isinstance(p, str) else next(texts) for p in parsed.echo]


async def chat_completions(request: web.Request) -> web.StreamResponse:
    server = request.app[SERVER]
    chat = parse_chat(await _json_body(request), server.config, server.model_name, _owner(request))
    return await answer_generation(request, server, chat.req, ChatAnswer(chat))


async def embeddings(request: web.Request) -> web.StreamResponse:
    body = await _json_body(request)
    return json_response(await embed_routes.embeddings(request.app[SERVER], body, _owner(request)))


async def rerank(request: web.Request) -> web.StreamResponse:
    body = await _json_body(request)
    return json_response(await embed_routes.rerank(request.app[SERVER], body, _owner(request)))


async def score(request: web.Request) -> web.StreamResponse:
    body = await _json_body(request)
    return json_response(await embed_routes.score(request.app[SERVER], body, _owner(request)))


# ---------------------------------------------------------------- Anthropic


async def messages(request: web.Request) -> web.StreamResponse:
    return await anthropic_api.create_message(request, request.app[SERVER], await _json_body(request),
                                              _owner(request))


async def count_tokens(request: web.Request) -> web.StreamResponse:
    return json_response(await anthropic_api.count_tokens(request.app[SERVER], await _json_body(request)))


async def create_response(request: web.Request) -> web.StreamResponse:
    server = request.app[SERVER]
    return await responses_api.create(request, server, await _json_body(request))


async def get_response(request: web.Request) -> web.StreamResponse:
    return json_response(responses_api.retrieve(request))


async def delete_response(request: web.Request) -> web.StreamResponse:
    return json_response(responses_api.delete(request))


async def cancel_response(request: web.Request) -> web.StreamResponse:
    return json_response(await responses_api.cancel(request, request.app[SERVER]))


async def openapi_document(request: web.Request) -> web.StreamResponse:
    return json_response(openapi.document(bool(request.app[SERVER].config.api_key)))


# ---------------------------------------------------------------- entry points


def serve(config: ServerConfig) -> int:
    """Resolve the config, launch the runtime and serve until SIGTERM/SIGINT (exit 0 after a
    drain) or a runtime failure (exit 1); exit 2 when the API key cannot be read.
    `tokenizer.cli` calls this for `radixserve serve`."""
    from tokenizer.lifecycle import run

    try:
        config = resolve_api_key(config)
    except InvalidRequest as exc:
        print(f"radixserve: invalid configuration: {exc}", file=sys.stderr)
        return 2
    return run(config, create_app)


def main(argv: list[str]) -> int:
    """`python -m tokenizer.http_server ARGS`: `radixserve serve ARGS` (the same flags, from
    `ServerConfig`), without importing the CLI module that imports this one."""
    import argparse

    from runtime.contracts.config import add_cli_arguments, config_from_args

    parser = argparse.ArgumentParser(prog="python -m tokenizer.http_server")
    add_cli_arguments(parser)
    try:
        config = config_from_args(parser.parse_args(argv))
    except InvalidRequest as exc:
        parser.error(str(exc))
    return serve(config)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
