"""The OpenAPI 3.1 document of this server, served at `GET /openapi.json` (vLLM and SGLang serve
one too): every route, its request body and its answers, for clients, gateways and fuzzers.

    doc = document(SchemaLimits.of(server))

It is built per server (its limits are the schemas' bounds) from the validators' own tables
(`openapi_bodies.py`); `ROUTES` lists what `http_server.create_app` serves, and a test holds the
two to each other. Errors are `#/components/schemas/Error` (`tokenizer.errors`; Anthropic's
`AnthropicError` on the Messages API, `tokenizer/anthropic/errors.py`), with the
statuses a route can answer: 403 (browser guard) and 503 (starting, draining, overloaded, dead)
everywhere, 400/413/415 where a JSON body is read, 504 where the runtime is asked.
With an API key the document says so (bearer; /health exempt) and needs the key itself, like
every route but /health: it describes the server's limits, and deny-by-default is this server's
rule (vLLM guards only /v1/*; tools that read a document can send a key).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tokenizer.anthropic.schema import request_schemas as anthropic_requests
from tokenizer.anthropic.schema import response_schemas as anthropic_answers
from tokenizer.errors import AUTH_EXEMPT_PATHS
from tokenizer.native_api import VERSION
from tokenizer.openai.responses.schema import request_schemas as responses_requests
from tokenizer.openai.responses.schema import response_schemas as responses_answers
from tokenizer.openapi_bodies import (
    BOOL,
    Schema,
    SchemaLimits,
    abort_request,
    array,
    chat_message,
    chat_request,
    completion_request,
    generate_request,
    obj,
    ref,
    sampling_properties,
    token_requests,
)

__all__ = ["ROUTES", "Route", "SchemaLimits", "document"]

# ---------------------------------------------------------------- answers

NUMBER: Schema = {"type": "number"}
INT: Schema = {"type": "integer"}
STR: Schema = {"type": "string"}
ERROR_TEXTS = {
    400: "invalid request: `param` names the field", 401: "missing or wrong API key",
    403: "refused by the browser guard (a foreign Origin, Host or cross-site fetch)",
    404: "no such response for this API key (and cache salt)",
    413: "body over --max-request-bytes", 415: "the body is not JSON",
    503: "starting, draining, overloaded or dead (with Retry-After)",
    504: "the runtime did not answer in time",
}


def _answer(props: dict[str, Schema], required: tuple[str, ...]) -> Schema:
    """A response object: these keys (typed exactly), others allowed."""
    return obj(props, required, not_null=True)


def response_schemas() -> dict[str, Schema]:
    """The bodies of 2xx and error answers."""
    error = _answer({"message": STR, "type": STR, "param": {"type": ["string", "null"]},
                     "code": INT}, ("message", "type", "param", "code"))
    meta = _answer({"id": STR, "finish_reason": {"type": ["object", "null"]}, "prompt_tokens": INT,
                    "completion_tokens": INT, "cached_tokens": INT, "e2e_latency": NUMBER},
                   ("id", "finish_reason", "prompt_tokens", "completion_tokens"))
    state = _answer({"running": INT, "waiting": INT, "integrity": STR},
                    ("running", "waiting", "integrity"))
    load = _answer({"dp_rank": INT, "num_reqs": INT, "num_waiting_reqs": INT, "num_tokens": INT},
                   ("num_reqs", "num_tokens"))
    return {
        "Error": _answer({"error": error}, ("error",)),
        "GenerateResponse": _answer({"text": STR, "output_ids": array(INT), "meta_info": meta},
                                    ("text", "output_ids", "meta_info")),
        "ModelInfo": _answer({"model_path": {"type": ["string", "null"]}, "served_model_name": STR,
                              "is_generation": BOOL,
                              "context_length": {"type": ["integer", "null"]}},
                             ("served_model_name",)),
        "ServerInfo": _answer({"version": STR, "status": STR, "internal_states": array(state)},
                              ("version", "internal_states")),
        "Load": array(load),
        "TokenizeResponse": _answer({"tokens": {"anyOf": [array(INT), array(array(INT))]},
                                     "count": {"anyOf": [INT, array(INT)]}, "max_model_len": INT},
                                    ("tokens", "count")),
        "DetokenizeResponse": _answer({"text": STR}, ("text",)),
        "AbortResponse": _answer({"success": BOOL, "rid": STR, "abort_all": BOOL}, ("success",)),
        **_openai_answers(),
    }


def _openai_answers() -> dict[str, Schema]:
    usage = _answer({"prompt_tokens": INT, "completion_tokens": INT, "total_tokens": INT},
                    ("prompt_tokens", "completion_tokens", "total_tokens"))
    header = {"id": STR, "object": STR, "created": INT, "model": STR}
    top = ("id", "object", "created", "model", "choices", "usage")
    reason = {"type": ["string", "null"], "description": "stop, length, abort or tool_calls"}
    choice = {"index": INT, "finish_reason": reason, "logprobs": {"type": ["object", "null"]}}
    message = _answer({"role": STR, "content": {"type": ["string", "null"]},
                       "tool_calls": array({"type": "object"}), "reasoning_content": STR},
                      ("role",))
    completion = _answer({**choice, "text": STR}, ("index", "text", "finish_reason"))
    chat = _answer({**choice, "message": message}, ("index", "message", "finish_reason"))
    card = _answer({"id": STR, "object": {"const": "model"}, "created": INT, "owned_by": STR,
                    "max_model_len": {"type": ["integer", "null"]}}, ("id", "object"))
    return {
        "Usage": usage,
        "Completion": _answer({**header, "choices": array(completion), "usage": ref("Usage")}, top),
        "ChatCompletion": _answer({**header, "choices": array(chat), "usage": ref("Usage")}, top),
        "ModelList": _answer({"object": {"const": "list"}, "data": array(card)},
                             ("object", "data")),
    }


def _json(schema: Schema) -> dict[str, Any]:
    return {"application/json": {"schema": schema}}


# NOTE: an event stream's `schema` describes one event, as Open API 3.2's `itemSchema` does.
SSE = {"text/event-stream": {"schema": _answer({"data": {
    "type": "string", "description": "a JSON chunk (a later error: an Error object), then [DONE]"},
    "event": STR}, ("data",))}}
TEXT = {"text/plain": {"schema": STR}}


def _error(status: int, schema: str = "Error") -> Schema:
    out: Schema = {"description": ERROR_TEXTS[status], "content": _json(ref(schema))}
    if status == 503:
        out["headers"] = {"Retry-After": {"schema": INT, "description": "seconds"}}
    return out


# ---------------------------------------------------------------- routes

BODY_ERRORS, RUNTIME_ERRORS = (400, 413, 415), (504,)
GENERATION_ERRORS = BODY_ERRORS + RUNTIME_ERRORS


@dataclass(frozen=True, slots=True)
class Route:
    """One operation: its body (a component name), 200 answer and other statuses (403 and 503
    apply to every route, 401 to every route but /health when the server has a key)."""

    method: str
    path: str
    op_id: str
    summary: str
    body: str | None
    ok: dict[str, Any]
    errors: tuple[int, ...] = ()
    error_schema: str = "Error"  # the Messages API answers Anthropic's error shape


def _routes() -> list[Route]:
    answers = {"anyOf": [ref("GenerateResponse"), array(ref("GenerateResponse"))]}
    gen = ("Generate (SGLang's native API): one prompt or a batch, streamed or not",
           "GenerateRequest", {**_json(answers), **SSE}, GENERATION_ERRORS)
    tok = ("Prompt text -> token ids, encoded as /generate encodes text", "TokenizeRequest",
           _json(ref("TokenizeResponse")), BODY_ERRORS)
    detok = ("Token ids -> text", "DetokenizeRequest", _json(ref("DetokenizeResponse")),
             BODY_ERRORS)
    model = ("The served model (SGLang)", None, _json(ref("ModelInfo")))
    server = ("Config without secrets, and the scheduler's live state", None,
              _json(ref("ServerInfo")), RUNTIME_ERRORS)
    return [
        Route("post", "/generate", "generate", *gen),
        Route("put", "/generate", "generate_put", *gen),
        Route("get", "/health", "health", "200 while the server is ready, else 503", None, {}),
        Route("get", "/health_generate", "health_generate", "200 when a one-token generation "
              "finishes in time", None, {}, RUNTIME_ERRORS),
        Route("get", "/get_model_info", "get_model_info", *model),
        Route("get", "/model_info", "model_info", *model),
        Route("get", "/get_server_info", "get_server_info", *server),
        Route("get", "/server_info", "server_info", *server),
        Route("get", "/get_load", "get_load", "Per-rank load (sglang-router reads it)", None,
              _json(ref("Load")), RUNTIME_ERRORS),
        Route("post", "/tokenize", "tokenize", *tok),
        Route("post", "/v1/tokenize", "v1_tokenize", *tok),
        Route("post", "/detokenize", "detokenize", *detok),
        Route("post", "/v1/detokenize", "v1_detokenize", *detok),
        Route("post", "/flush_cache", "flush_cache", "Empty the prefix cache (a 400 while requests "
              "run)", None, TEXT, (400,) + RUNTIME_ERRORS),
        Route("post", "/abort_request", "abort_request", "Abort by rid (its n>1 children too) or "
              "everything", "AbortRequest", _json(ref("AbortResponse")),
              BODY_ERRORS + RUNTIME_ERRORS),
        Route("get", "/metrics", "metrics", "Prometheus metrics", None, TEXT),
        Route("get", "/v1/models", "list_models", "The one served model (OpenAI)", None,
              _json(ref("ModelList"))),
        Route("post", "/v1/completions", "completions", "OpenAI completions", "CompletionRequest",
              {**_json(ref("Completion")), **SSE}, GENERATION_ERRORS),
        Route("post", "/v1/chat/completions", "chat_completions", "OpenAI chat completions",
              "ChatCompletionRequest", {**_json(ref("ChatCompletion")), **SSE}, GENERATION_ERRORS),
        Route("post", "/v1/messages", "messages", "Anthropic's Messages API", "MessagesRequest",
              {**_json(ref("AnthropicMessage")), **SSE}, GENERATION_ERRORS, "AnthropicError"),
        Route("post", "/v1/messages/count_tokens", "count_tokens", "Anthropic's token count of a "
              "Messages API prompt", "CountTokensRequest", _json(ref("MessageTokensCount")),
              BODY_ERRORS, "AnthropicError"),
        *_responses_routes(),
        Route("get", "/openapi.json", "openapi", "This document", None, _json({"type": "object"})),
    ]


def _responses_routes() -> list[Route]:
    """OpenAI's Responses API (tokenizer/openai/responses/)."""
    one, path = _json(ref("Response")), "/v1/responses/{response_id}"
    return [
        Route("post", "/v1/responses", "create_response", "OpenAI Responses: create (stream: typed events)",
              "ResponseRequest", {**one, **SSE}, GENERATION_ERRORS + (404,)),
        Route("get", path, "get_response", "A stored or running response", None, one, (400, 404)),
        Route("delete", path, "delete_response", "Forget a stored response", None,
              _json(ref("ResponseDeleted")), (400, 404)),
        Route("post", path + "/cancel", "cancel_response", "Cancel a running response", None, one,
              (400, 404) + RUNTIME_ERRORS),
    ]


ROUTES = _routes()


def _operation(route: Route, lim: SchemaLimits) -> Schema:
    ok: Schema = {"description": "OK"}
    if route.ok:
        ok["content"] = route.ok
    auth = (401,) if lim.api_key and route.path not in AUTH_EXEMPT_PATHS else ()
    statuses = sorted(set(route.errors + auth + (403, 503)))
    op: Schema = {"operationId": route.op_id, "summary": route.summary,
                  "responses": {"200": ok, **{str(s): _error(s, route.error_schema) for s in statuses}}}
    if route.body is not None:
        op["requestBody"] = {"required": True, "content": _json(ref(route.body))}
    if "{response_id}" in route.path:  # a salted response's owner gives its salt (400: an empty one)
        op["parameters"] = [{"name": "response_id", "in": "path", "required": True, "schema": STR},
                            *({"name": salt, "in": "query", "schema": {**STR, "minLength": 1}}
                              for salt in ("cache_salt", "extra_key"))]
    if lim.api_key and route.path in AUTH_EXEMPT_PATHS:
        op["security"] = []
    return op


def document(lim: SchemaLimits) -> Schema:
    """The OpenAPI 3.1 document of a server with these limits."""
    paths: dict[str, Schema] = {}
    for route in ROUTES:
        paths.setdefault(route.path, {})[route.method] = _operation(route, lim)
    schemas = {"SamplingParams": obj(sampling_properties(lim), closed=True),
               "GenerateRequest": generate_request(lim),
               "CompletionRequest": completion_request(lim),
               "ChatCompletionRequest": chat_request(lim), "ChatMessage": chat_message(),
               "AbortRequest": abort_request(), **token_requests(lim), **response_schemas(),
               **anthropic_requests(lim), **anthropic_answers(), **responses_requests(lim), **responses_answers()}
    doc: Schema = {
        "openapi": "3.1.0",
        "info": {"title": "radixserve", "version": VERSION,
                 "description": "SGLang's native API and OpenAI's, served by radixserve. Bounds "
                                "are this server's: context length, vocabulary and caps."},
        "paths": paths, "components": {"schemas": schemas},
    }
    if lim.api_key:
        doc["components"]["securitySchemes"] = {"bearer": {"type": "http", "scheme": "bearer"}}
        doc["security"] = [{"bearer": []}]
    return doc
