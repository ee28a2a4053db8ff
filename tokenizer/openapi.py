"""The OpenAPI 3.1 document of this server, served at `GET /openapi.json`: every route, its
request body and its answers, for clients, gateways and fuzzers.

    doc = document(api_key=bool(config.api_key))

Request bodies are the field specs themselves (`tokenizer/*/spec.py`, JSON Schema from pydantic),
so the document and the validators cannot disagree. `ROUTES` lists what `http_server.create_app`
serves, and a test holds the two to each other. Errors are `Error` (OpenAI's object) or, on the
Messages API, `AnthropicError`, with the statuses a route can answer: 403 (browser guard) and 503
(starting, draining, overloaded or dead) everywhere, 400/413/415 where a JSON body is read, 504
where the runtime is asked. With an API key the document says so (bearer; /health exempt).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from tokenizer.anthropic.spec import CountBody, MessagesBody
from tokenizer.errors import AUTH_EXEMPT_PATHS
from tokenizer.native.spec import AbortBody, DetokenizeBody, GenerateBody, TokenizeBody
from tokenizer.openai.embed_spec import EmbeddingBody, RerankBody, ScoreBody
from tokenizer.openai.responses.spec import ResponseBody
from tokenizer.openai.spec import ChatBody, CompletionBody

__all__ = ["ROUTES", "Route", "document"]

Schema = dict[str, Any]
VERSION = "0.1.0"
BODIES: dict[str, type[BaseModel]] = {
    "GenerateRequest": GenerateBody, "AbortRequest": AbortBody, "TokenizeRequest": TokenizeBody,
    "DetokenizeRequest": DetokenizeBody, "CompletionRequest": CompletionBody, "ChatCompletionRequest": ChatBody,
    "ResponseRequest": ResponseBody, "MessagesRequest": MessagesBody, "CountTokensRequest": CountBody,
    "EmbeddingRequest": EmbeddingBody, "RerankRequest": RerankBody, "ScoreRequest": ScoreBody,
}
ERROR_TEXTS = {
    400: "invalid request: `param` names the field", 401: "missing or wrong API key",
    403: "refused by the browser guard (a foreign Origin, Host or cross-site fetch)",
    404: "no such response for this API key (and cache salt)",
    413: "body over --max-request-bytes", 415: "the body is not JSON",
    503: "starting, draining, overloaded or dead (with Retry-After)",
    504: "the runtime did not answer in time",
}
STR, INT, OBJ = {"type": "string"}, {"type": "integer"}, {"type": "object"}


def _ref(name: str) -> Schema:
    return {"$ref": f"#/components/schemas/{name}"}


def _obj(required: tuple[str, ...], **props: Schema) -> Schema:
    """An answer object: these keys, typed; others allowed."""
    return {"type": "object", "properties": props, "required": list(required)}


def _answers() -> dict[str, Schema]:
    """The bodies of 2xx and error answers (what this server writes, not what it validates)."""
    error = _obj(("message", "type", "param", "code"), message=STR, type=STR, param={"type": ["string", "null"]},
                 code=INT)
    usage = _obj(("prompt_tokens", "completion_tokens", "total_tokens"), prompt_tokens=INT, completion_tokens=INT,
                 total_tokens=INT)
    header = {"id": STR, "object": STR, "created": INT, "model": STR, "usage": _ref("Usage")}
    top = ("id", "object", "created", "model", "choices")
    return {
        "Error": _obj(("error",), error=error),
        "AnthropicError": _obj(("type", "error"), type={"const": "error"},
                               error=_obj(("type", "message"), type=STR, message=STR)),
        "Usage": usage,
        "GenerateResponse": _obj(("text", "output_ids", "meta_info"), text=STR,
                                 output_ids={"type": "array", "items": INT}, meta_info=OBJ),
        "Completion": _obj(top, **header, choices={"type": "array", "items": OBJ}),
        "ChatCompletion": _obj(top, **header, choices={"type": "array", "items": OBJ}),
        "ModelList": _obj(("object", "data"), object={"const": "list"}, data={"type": "array", "items": OBJ}),
        "AnthropicMessage": _obj(("id", "type", "role", "content", "stop_reason", "usage"), id=STR,
                                 type={"const": "message"}, role=STR, content={"type": "array", "items": OBJ},
                                 stop_reason={"type": ["string", "null"]}, usage=OBJ),
        "MessageTokensCount": _obj(("input_tokens",), input_tokens=INT),
        "Response": _obj(("id", "object", "status", "output"), id=STR, object={"const": "response"}, status=STR,
                         output={"type": "array", "items": OBJ}),
        "ResponseDeleted": _obj(("id", "object", "deleted"), id=STR, object=STR, deleted={"type": "boolean"}),
        "TokenizeResponse": _obj(("tokens", "count"), tokens={"type": "array"}, count={}, max_model_len=INT),
        "DetokenizeResponse": _obj(("text",), text=STR),
        "AbortResponse": _obj(("success",), success={"type": "boolean"}),
        "ModelInfo": _obj(("served_model_name",), served_model_name=STR),
        "ServerInfo": _obj(("version",), version=STR),
        "Load": {"type": "array", "items": OBJ},
        "EmbeddingList": _obj(("object", "data", "model", "usage"), object={"const": "list"},
                              data={"type": "array", "items": _obj(("object", "index", "embedding"), object=STR,
                                                                   index=INT, embedding={})}, model=STR, usage=OBJ),
        "RerankResponse": _obj(("id", "results"), id=STR, model=STR, results={"type": "array", "items": _obj(
            ("index", "relevance_score"), index=INT, relevance_score={"type": "number"}, document=OBJ)}, usage=OBJ,
            meta=OBJ),
        "ScoreResponse": _obj(("id", "object", "data", "usage"), id=STR, object={"const": "list"}, model=STR,
                              data={"type": "array", "items": _obj(("index", "object", "score"), index=INT,
                                                                   object=STR, score={"type": "number"})}, usage=OBJ),
    }


@functools.cache
def _bodies() -> dict[str, Schema]:
    """The request bodies' schemas, from the specs (shared parts under their own names)."""
    pairs: list[tuple[type[BaseModel], Literal["validation"]]] = [(m, "validation") for m in BODIES.values()]
    refs, top = models_json_schema(pairs, ref_template="#/components/schemas/{model}")
    schemas: dict[str, Schema] = dict(top.get("$defs", {}))
    for name, model in BODIES.items():
        schemas[name] = schemas.pop(model.__name__, refs[(model, "validation")])
    return _closed_keys(schemas)


def _closed_keys(node: Any) -> Any:
    """`node` with every `patternProperties` of one pattern (pydantic's form of a dict whose keys
    are constrained) as `propertyNames` + `additionalProperties`: the validator refuses any other
    key, where `patternProperties` alone would let it through unchecked."""
    if isinstance(node, list):
        return [_closed_keys(item) for item in node]
    if not isinstance(node, dict):
        return node
    out = {key: _closed_keys(value) for key, value in node.items()}
    patterns = out.get("patternProperties")
    if isinstance(patterns, dict) and len(patterns) == 1 and "additionalProperties" not in out:
        ((pattern, values),) = patterns.items()
        del out["patternProperties"]
        out.update(propertyNames={"pattern": pattern}, additionalProperties=values)
    return out


def _json(schema: Schema) -> dict[str, Any]:
    return {"application/json": {"schema": schema}}


# NOTE: an event stream's `schema` describes one event, as OpenAPI 3.2's `itemSchema` does.
SSE = {"text/event-stream": {"schema": _obj(("data",), data={"type": "string"}, event=STR)}}
TEXT = {"text/plain": {"schema": STR}}
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
    error_schema: str = "Error"


def _routes() -> list[Route]:
    gen = ("Generate (SGLang's native API)", "GenerateRequest",
           {**_json({"anyOf": [_ref("GenerateResponse"), {"type": "array", "items": _ref("GenerateResponse")}]}),
            **SSE}, GENERATION_ERRORS)
    tok = ("Prompt text -> token ids", "TokenizeRequest", _json(_ref("TokenizeResponse")), BODY_ERRORS)
    detok = ("Token ids -> text", "DetokenizeRequest", _json(_ref("DetokenizeResponse")), BODY_ERRORS)
    model = ("The served model (SGLang)", None, _json(_ref("ModelInfo")))
    server = ("Config without secrets, and the scheduler's live state", None, _json(_ref("ServerInfo")),
              RUNTIME_ERRORS)
    one, path = _json(_ref("Response")), "/v1/responses/{response_id}"
    return [
        Route("post", "/generate", "generate", *gen), Route("put", "/generate", "generate_put", *gen),
        Route("get", "/health", "health", "200 while the server is ready, else 503", None, {}),
        Route("get", "/health_generate", "health_generate", "200 when a one-token generation finishes in time",
              None, {}, RUNTIME_ERRORS),
        Route("get", "/get_model_info", "get_model_info", *model), Route("get", "/model_info", "model_info", *model),
        Route("get", "/get_server_info", "get_server_info", *server),
        Route("get", "/server_info", "server_info", *server),
        Route("get", "/get_load", "get_load", "Per-rank load (sglang-router reads it)", None, _json(_ref("Load")),
              RUNTIME_ERRORS),
        Route("post", "/tokenize", "tokenize", *tok), Route("post", "/v1/tokenize", "v1_tokenize", *tok),
        Route("post", "/detokenize", "detokenize", *detok), Route("post", "/v1/detokenize", "v1_detokenize", *detok),
        Route("post", "/flush_cache", "flush_cache", "Empty the prefix cache (a 400 while requests run)", None, TEXT,
              (400,) + RUNTIME_ERRORS),
        Route("post", "/abort_request", "abort_request", "Abort the caller's requests by rid, or all of them",
              "AbortRequest", _json(_ref("AbortResponse")), BODY_ERRORS + RUNTIME_ERRORS),
        Route("get", "/metrics", "metrics", "Prometheus metrics", None, TEXT),
        Route("get", "/v1/models", "list_models", "The one served model (OpenAI)", None, _json(_ref("ModelList"))),
        Route("post", "/v1/completions", "completions", "OpenAI completions", "CompletionRequest",
              {**_json(_ref("Completion")), **SSE}, GENERATION_ERRORS),
        Route("post", "/v1/chat/completions", "chat_completions", "OpenAI chat completions", "ChatCompletionRequest",
              {**_json(_ref("ChatCompletion")), **SSE}, GENERATION_ERRORS),
        Route("post", "/v1/messages", "messages", "Anthropic's Messages API", "MessagesRequest",
              {**_json(_ref("AnthropicMessage")), **SSE}, GENERATION_ERRORS, "AnthropicError"),
        Route("post", "/v1/messages/count_tokens", "count_tokens", "Anthropic's token count of a prompt",
              "CountTokensRequest", _json(_ref("MessageTokensCount")), BODY_ERRORS, "AnthropicError"),
        Route("post", "/v1/embeddings", "embeddings", "OpenAI embeddings (float or base64)", "EmbeddingRequest",
              _json(_ref("EmbeddingList")), GENERATION_ERRORS),
        Route("post", "/v1/rerank", "rerank", "Rerank documents by cosine similarity (Cohere's and Jina's shape)",
              "RerankRequest", _json(_ref("RerankResponse")), GENERATION_ERRORS),
        Route("post", "/v1/score", "score", "Cosine similarity of text pairs (vLLM's shape)", "ScoreRequest",
              _json(_ref("ScoreResponse")), GENERATION_ERRORS),
        Route("post", "/v1/responses", "create_response", "OpenAI Responses: create (stream: typed events)",
              "ResponseRequest", {**one, **SSE}, GENERATION_ERRORS + (404,)),
        Route("get", path, "get_response", "A stored or running response", None, one, (400, 404)),
        Route("delete", path, "delete_response", "Forget a stored response", None, _json(_ref("ResponseDeleted")),
              (400, 404)),
        Route("post", path + "/cancel", "cancel_response", "Cancel a running response", None, one,
              (400, 404) + RUNTIME_ERRORS),
        Route("get", "/openapi.json", "openapi", "This document", None, _json(OBJ)),
    ]


ROUTES = _routes()


def _error(status: int, schema: str) -> Schema:
    out: Schema = {"description": ERROR_TEXTS[status], "content": _json(_ref(schema))}
    if status == 503:
        out["headers"] = {"Retry-After": {"schema": INT, "description": "seconds"}}
    return out


def _operation(route: Route, api_key: bool) -> Schema:
    ok: Schema = {"description": "OK"}
    if route.ok:
        ok["content"] = route.ok
    auth = (401,) if api_key and route.path not in AUTH_EXEMPT_PATHS else ()
    statuses = sorted(set(route.errors + auth + (403, 503)))
    op: Schema = {"operationId": route.op_id, "summary": route.summary,
                  "responses": {"200": ok, **{str(s): _error(s, route.error_schema) for s in statuses}}}
    if route.body is not None:
        op["requestBody"] = {"required": True, "content": _json(_ref(route.body))}
    if "{response_id}" in route.path:  # a salted response's owner gives its salt
        op["parameters"] = [{"name": "response_id", "in": "path", "required": True, "schema": STR},
                            *({"name": salt, "in": "query", "schema": {**STR, "minLength": 1}}
                              for salt in ("cache_salt", "extra_key"))]
    if api_key and route.path in AUTH_EXEMPT_PATHS:
        op["security"] = []
    return op


def document(api_key: bool = False) -> Schema:
    """The OpenAPI 3.1 document of a server (with or without an API key)."""
    paths: dict[str, Schema] = {}
    for route in ROUTES:
        paths.setdefault(route.path, {})[route.method] = _operation(route, api_key)
    doc: Schema = {
        "openapi": "3.1.0",
        "info": {"title": "radixserve", "version": VERSION,
                 "description": "SGLang's native API, OpenAI's and Anthropic's, served by radixserve."},
        "paths": paths, "components": {"schemas": {**_bodies(), **_answers()}},
    }
    if api_key:
        doc["components"]["securitySchemes"] = {"bearer": {"type": "http", "scheme": "bearer"}}
        doc["security"] = [{"bearer": []}]
    return doc
