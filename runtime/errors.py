"""Typed errors raised at the runtime's boundaries."""

from __future__ import annotations


class InvalidRequest(ValueError):
    """Bad input from a client or a caller; the HTTP layer turns it into a 400 naming `param`."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param


class OutOfCapacity(RuntimeError):
    """The KV cache or request slots cannot hold what was asked, even after eviction."""


class UnsupportedModel(ValueError):
    """A checkpoint whose architecture radixserve does not implement."""


class RuntimeCrashed(RuntimeError):
    """A runtime child process died (or the runtime was shut down): in-flight and later requests
    fail with this; the HTTP layer turns it into a 503 (or a stream error event)."""
