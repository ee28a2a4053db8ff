"""Typed errors raised at the runtime's boundaries."""

from __future__ import annotations


class InvalidRequest(ValueError):
    """Bad input from a client or a caller; the HTTP layer turns it into a 400 naming `param`."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param


class Overloaded(RuntimeError):
    """The server holds as many requests as it admits: come back after `retry_after` seconds
    (the HTTP layer answers 503 with Retry-After; nothing of the request was queued)."""

    def __init__(self, message: str, retry_after: float = 1.0) -> None:
        super().__init__(message)
        self.message = message
        self.retry_after = retry_after


class OutOfCapacity(RuntimeError):
    """The KV cache or request slots cannot hold what was asked, even after eviction."""


class UnsupportedModel(ValueError):
    """A checkpoint whose architecture radixserve does not implement."""


class RuntimeCrashed(RuntimeError):
    """A runtime child process died (or the runtime was shut down): in-flight and later requests
    fail with this; the HTTP layer turns it into a 503 (or a stream error event)."""
