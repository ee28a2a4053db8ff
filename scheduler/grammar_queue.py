"""The grammar queue: requests wait here while their grammar compiles off the scheduler thread.

A request with `json_schema`, `regex` or `ebnf` gets a compile future at arrival (cached by
grammar, so n>1 children and repeated schemas compile once) and joins the waiting queue once it
resolves. A failed compile finishes it with the error, naming its field (the client gets a 400);
a compile that ran out of time (scheduler/grammar_compile.py bounds each one) fails only its
requests and is forgotten by the cache, so the same spec compiles again if asked again. It can
be aborted while it waits, like anywhere else, and its request deadline applies there too.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from runtime.contracts.errors import InvalidRequest
from runtime.support.grammar_check import grammar_spec
from scheduler.request import Req

if TYPE_CHECKING:  # scheduler.grammar imports xgrammar lazily; keep it out of module import
    from scheduler.grammar import GrammarBackend


class GrammarQueue:
    """Owns the (lazily built) GrammarBackend and the requests waiting for a compile."""

    def __init__(self, make_backend: Callable[[], GrammarBackend] | None) -> None:
        self.make_backend = make_backend
        self.backend: GrammarBackend | None = None
        self.pending: list[Req] = []

    def submit(self, req: Req) -> bool:
        """Start the request's compile and keep it; False when it has no grammar."""
        spec = grammar_spec(req.sampling)
        if spec is None:
            return False
        req.grammar_future = self._backend().submit(spec)
        self.pending.append(req)
        return True

    def poll(self) -> tuple[list[Req], list[tuple[Req, InvalidRequest]]]:
        """(requests whose grammar is ready, (request, error) for failures), in arrival order."""
        from scheduler.grammar_compile import CompileTimeout

        ready: list[Req] = []
        failed: list[tuple[Req, InvalidRequest]] = []
        still: list[Req] = []
        for req in self.pending:
            future = req.grammar_future
            assert future is not None, "submit() gave every pending request a compile"
            if not future.done():
                still.append(req)
                continue
            try:
                req.grammar = self._backend().new_state(future.result())
                ready.append(req)
            except InvalidRequest as exc:  # a bad grammar fails only its request
                if isinstance(exc, CompileTimeout):
                    spec = grammar_spec(req.sampling)
                    if spec is not None:
                        self._backend().forget(spec)
                    failed.append((req, exc))
                else:
                    failed.append((req, InvalidRequest(f"invalid grammar: {exc.message}", param=exc.param)))
        self.pending = still
        return ready, failed

    def reset(self) -> None:
        if self.backend is not None:
            self.backend.reset()

    def _backend(self) -> GrammarBackend:
        if self.backend is None:
            assert self.make_backend is not None, "this scheduler has no grammar support"
            self.backend = self.make_backend()
        return self.backend
