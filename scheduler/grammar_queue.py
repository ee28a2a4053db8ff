"""The grammar queue: requests wait here while their grammar compiles off the scheduler thread.

A request with `json_schema`, `regex` or `ebnf` gets a compile future at arrival (cached by
grammar, so n>1 children and repeated schemas compile once) and joins the waiting queue once it
resolves. A failed compile finishes it with the error; one still compiling after
`COMPILE_TIMEOUT_S` is finished with a timeout and its grammar is cached as failed. It can be
aborted while it waits, like anywhere else.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from runtime.grammar_check import grammar_spec
from scheduler.request import Req

if TYPE_CHECKING:  # scheduler.grammar imports xgrammar lazily; keep it out of module import
    from scheduler.grammar import GrammarBackend


class GrammarQueue:
    """Owns the (lazily built) GrammarBackend and the requests waiting for a compile."""

    def __init__(self, make_backend: Callable[[], GrammarBackend] | None) -> None:
        self.make_backend = make_backend
        self.backend: GrammarBackend | None = None
        self.pending: list[tuple[Req, float]] = []  # (request, deadline)

    def submit(self, req: Req) -> bool:
        """Start the request's compile and keep it; False when it has no grammar."""
        spec = grammar_spec(req.sampling)
        if spec is None:
            return False
        from scheduler.grammar import COMPILE_TIMEOUT_S

        req.grammar_future = self._backend().submit(spec)
        self.pending.append((req, time.monotonic() + COMPILE_TIMEOUT_S))
        return True

    def poll(self) -> tuple[list[Req], list[tuple[Req, str]]]:
        """(requests whose grammar is ready, (request, error) for failures), in arrival order."""
        ready: list[Req] = []
        failed: list[tuple[Req, str]] = []
        still: list[tuple[Req, float]] = []
        now = time.monotonic()
        for req, deadline in self.pending:
            future = req.grammar_future
            if future.done():
                try:
                    req.grammar = self._backend().new_state(future.result())
                    ready.append(req)
                except Exception as exc:  # noqa: BLE001 - a bad grammar fails only its request
                    failed.append((req, f"invalid grammar: {exc}"))
            elif now > deadline:
                spec = grammar_spec(req.sampling)
                message = "grammar compilation timed out"
                if spec is not None:
                    self._backend().fail(spec, message)
                failed.append((req, message))
            else:
                still.append((req, deadline))
        self.pending = still
        return ready, failed

    def remove_matching(self, matches: Callable[[str], bool]) -> list[Req]:
        removed = [req for req, _ in self.pending if matches(req.rid)]
        self.pending = [(r, d) for r, d in self.pending if not matches(r.rid)]
        return removed

    def reset(self) -> None:
        if self.backend is not None:
            self.backend.reset()

    def _backend(self) -> GrammarBackend:
        if self.backend is None:
            assert self.make_backend is not None, "this scheduler has no grammar support"
            self.backend = self.make_backend()
        return self.backend
