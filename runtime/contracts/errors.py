"""Typed errors raised at the runtime's boundaries."""

from __future__ import annotations

from collections.abc import Mapping


class InvalidRequest(ValueError):
    """Bad input from a client or a caller; the HTTP layer turns it into a 400 naming `param`.

    An error made by `field(param, problem)` reads "param: problem", so a protocol that calls
    the field otherwise renames it whole (`renamed`): the runtime's checks use SGLang's names
    (max_new_tokens), an OpenAI client sees its own (max_tokens)."""

    def __init__(self, message: str, param: str | None = None, problem: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.problem = problem

    @classmethod
    def field(cls, param: str, problem: str) -> InvalidRequest:
        return cls(f"{param}: {problem}", param=param, problem=problem)

    def renamed(self, names: Mapping[str, str]) -> InvalidRequest:
        """This error with its field called as `names` calls it (unchanged when not listed)."""
        if self.param is None or self.param not in names:
            return self
        name = names[self.param]
        if self.problem is None:
            return InvalidRequest(self.message, param=name)
        return InvalidRequest.field(name, self.problem)


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
