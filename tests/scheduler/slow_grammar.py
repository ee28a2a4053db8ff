"""A grammar build with an injected delay, for timeout tests that must not depend on CPU speed.

It runs inside the grammar validation worker (a spawned process), so it lives in a small module
of its own: the worker imports only this and `runtime.support.grammar_check`.
"""

from __future__ import annotations

import time
from typing import Any

from runtime.support.grammar_check import GrammarSpec, build_grammar

SLOW_MARKER = "slow-to-build"
DELAY_S = 60.0


def slow_build(spec: GrammarSpec) -> Any:
    """`build_grammar`, but a spec whose source names SLOW_MARKER builds for DELAY_S first."""
    if SLOW_MARKER in spec.source:
        time.sleep(DELAY_S)
    return build_grammar(spec)


def slow_compile(compiler: Any, spec: GrammarSpec, json_options: Any) -> Any:
    """`scheduler.grammar_compile.compile_spec`, but a SLOW_MARKER spec never finishes in time
    (it runs in the scheduler's compile helper process)."""
    from scheduler.grammar_compile import compile_spec

    if SLOW_MARKER in spec.source:
        time.sleep(DELAY_S)
    return compile_spec(compiler, spec, json_options)
