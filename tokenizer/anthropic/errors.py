"""Anthropic's error shape on the Messages API routes, whatever raised the error:

    {"type": "error", "error": {"type": "invalid_request_error", "message": "max_tokens: ..."}}

Every other route answers OpenAI's error object (`tokenizer.errors`); `error_shape_middleware`
sits outside `error_middleware` and rewrites its answers on these paths, so that the browser
guard's 403, the key's 401, readiness 503s and aiohttp's 404/405/413/415 take this shape too.
Anthropic's object has no `param`: the field leads the message instead.
"""

from __future__ import annotations

from typing import Any

import orjson
from aiohttp import web

from tokenizer.errors import Handler, Middleware

PATH = "/v1/messages"
ERROR_TYPES = {
    400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
    404: "not_found_error", 405: "invalid_request_error", 413: "request_too_large",
    415: "invalid_request_error", 429: "rate_limit_error", 500: "api_error",
    503: "overloaded_error", 504: "timeout_error",
}


def is_messages_path(path: str) -> bool:
    return path == PATH or path.startswith(PATH + "/")


def named(message: str, param: str | None) -> str:
    """`message` led by the field it is about (unless it already names it first)."""
    if param and not message.startswith(param):
        return f"{param}: {message}"
    return message


def anthropic_error(status: int, message: str, param: str | None = None) -> dict[str, Any]:
    """Anthropic's error object for `status`."""
    kind = ERROR_TYPES.get(status, "invalid_request_error" if status < 500 else "api_error")
    return {"type": "error", "error": {"type": kind, "message": named(message, param)}}


def _reshaped(response: web.Response) -> web.Response:
    """An OpenAI error answer as Anthropic's (other bodies are left as they are)."""
    try:
        body = orjson.loads(response.body) if isinstance(response.body, bytes) else None
    except orjson.JSONDecodeError:
        return response
    error = body.get("error") if isinstance(body, dict) else None
    if not isinstance(error, dict) or not isinstance(error.get("message"), str):
        return response
    headers = {k: v for k, v in response.headers.items()
               if k.lower() not in ("content-type", "content-length")}
    new = anthropic_error(response.status, error["message"], error.get("param"))
    return web.Response(status=response.status, body=orjson.dumps(new),
                        content_type="application/json", headers=headers)


def error_shape_middleware() -> Middleware:
    """Anthropic-shaped errors on the Messages API paths (see the module docstring)."""

    @web.middleware
    async def reshape(request: web.Request, handler: Handler) -> web.StreamResponse:
        response = await handler(request)
        if response.status < 400 or not is_messages_path(request.path):
            return response
        return _reshaped(response) if isinstance(response, web.Response) else response

    return reshape
