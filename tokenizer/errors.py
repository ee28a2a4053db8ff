"""OpenAI-style error objects, and the middlewares that make every non-2xx response one.

Every error the server sends has OpenAI's shape, whatever the route:

    {"error": {"message": str, "type": str, "param": str | null, "code": <HTTP status>}}

`classify(exc)` is the one mapping from an exception to (status, message, param):
`InvalidRequest` -> 400 naming its field, `HTTPError` -> its own status (401, 503, ...),
`RuntimeCrashed` and `Overloaded` -> 503 (with Retry-After), aiohttp's own `HTTPException`s
(404, 405, 413) -> their status, an internal `TimeoutError` -> 504, and anything else -> 500 with
a generic message (the traceback goes to the log, never the client).
"""

from __future__ import annotations

import hmac
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import orjson
from aiohttp import web

from runtime.contracts.errors import InvalidRequest, Overloaded, RuntimeCrashed

logger = logging.getLogger("radixserve.http")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
Middleware = Callable[[web.Request, Handler], Awaitable[web.StreamResponse]]

ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    415: "invalid_request_error",
    500: "internal_server_error",
    503: "service_unavailable_error",
    504: "timeout_error",
}
# Every 503 says when to come back: clients (the openai package included) retry after it.
RETRY_AFTER_S = 1
INTERNAL_ERROR_MESSAGE = "Internal server error; see the server log."
AUTH_EXEMPT_PATHS = frozenset({"/health"})


class HTTPError(Exception):
    """An error answered with a given status, e.g. 503 while starting or draining."""

    def __init__(self, status: int, message: str, param: str | None = None, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param = status, message, param
        self.retry_after = retry_after


def error_body(status: int, message: str, param: str | None = None) -> dict[str, Any]:
    """OpenAI's error object for `status`."""
    kind = ERROR_TYPES.get(status, "invalid_request_error" if status < 500 else "server_error")
    return {"error": {"message": message, "type": kind, "param": param, "code": status}}


def error_response(status: int, message: str, param: str | None = None,
                   headers: dict[str, str] | None = None, retry_after: float | None = None) -> web.Response:
    """An error object response; a 503 carries Retry-After (`retry_after` s, default RETRY_AFTER_S)."""
    body = orjson.dumps(error_body(status, message, param))
    if status == 503:
        headers = {**(headers or {}), "Retry-After": str(max(1, round(retry_after or RETRY_AFTER_S)))}
    return web.Response(status=status, body=body, content_type="application/json",
                        headers=headers)


def classify(exc: BaseException) -> tuple[int, str, str | None]:
    """(status, message, param) for an exception raised while handling a request."""
    if isinstance(exc, InvalidRequest):
        return 400, exc.message, exc.param
    if isinstance(exc, HTTPError):
        return exc.status, exc.message, exc.param
    if isinstance(exc, RuntimeCrashed):
        return 503, f"The server cannot serve requests: {exc}", None
    if isinstance(exc, Overloaded):
        return 503, exc.message, None
    if isinstance(exc, web.HTTPException):
        return exc.status, _http_exception_message(exc), None
    if isinstance(exc, TimeoutError):  # an internal wait (the scheduler's answer) ran out
        return 504, "The runtime did not answer in time; retry later.", None
    return 500, INTERNAL_ERROR_MESSAGE, None


def _http_exception_message(exc: web.HTTPException) -> str:
    if isinstance(exc, web.HTTPNotFound):
        return "Not found: no such route."
    if isinstance(exc, web.HTTPMethodNotAllowed):
        allowed = ", ".join(sorted(exc.allowed_methods))
        return f"Method {exc.method} is not allowed here; allowed: {allowed}."
    return exc.text or exc.reason


@web.middleware
async def error_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """The outermost middleware: any exception (or aiohttp error response) becomes an error
    object. Cancellation (a client that went away) passes through untouched."""
    try:
        return await handler(request)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        status, message, param = classify(exc)
        headers = {"Allow": exc.headers["Allow"]} if "Allow" in exc.headers else None
        return error_response(status, message, param, headers)
    except (InvalidRequest, HTTPError, RuntimeCrashed, Overloaded, TimeoutError) as exc:
        return error_response(*classify(exc), retry_after=getattr(exc, "retry_after", None))
    except ConnectionError:
        logger.debug("client went away during %s %s", request.method, request.path)
        return web.Response(status=499)  # nginx's "client closed request"; never delivered
    except Exception:
        logger.exception("unhandled error in %s %s", request.method, request.path)
        return error_response(500, INTERNAL_ERROR_MESSAGE)


def auth_middleware(api_key: str) -> Middleware:
    """Deny by default: every path except `/health` needs `Authorization: Bearer <api_key>`
    (or `x-api-key: <api_key>`, which Anthropic's clients send), unknown paths included. The
    key is compared in constant time."""
    expected = api_key.encode("utf-8", "surrogateescape")

    @web.middleware
    async def check_key(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.path not in AUTH_EXEMPT_PATHS:
            scheme, _, token = request.headers.get("Authorization", "").partition(" ")
            bearer = scheme.lower() == "bearer"
            given = token.strip() if bearer else request.headers.get("x-api-key", "").strip()
            if not hmac.compare_digest(given.encode("utf-8", "surrogateescape"), expected):
                raise HTTPError(401, "Invalid or missing API key: "
                                     "send 'Authorization: Bearer <key>' or 'x-api-key: <key>'.")
        return await handler(request)

    return check_key
