"""Grammar compilation in a killable helper process (`runtime.support.worker_process`).

xgrammar's compile of a grammar against the tokenizer's vocabulary cannot be interrupted and is
unbounded for some inputs that pass validation, so it runs in a helper: a compile later than
COMPILE_TIMEOUT_S (counted from when the helper starts it, not from when it was queued) kills
the helper and fails that request only, with a `CompileTimeout` naming its field, which is not
cached (the same spec compiles again if asked again); the next compile starts a fresh helper.
The compiled grammar comes back serialized (xgrammar's JSON form) and is rebuilt against the
scheduler's own `TokenizerInfo`. The helper starts on the first compile (2-4 s: it imports
xgrammar, and so torch) and then stays.
"""

from __future__ import annotations

from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import TYPE_CHECKING, Any, NamedTuple

from runtime.contracts.errors import InvalidRequest
from runtime.support.grammar_check import GrammarSpec, clean_error
from runtime.support.worker_process import KillableWorker, serve

if TYPE_CHECKING:
    from xgrammar import CompiledGrammar, GrammarCompiler, TokenizerInfo

# A 6-field JSON schema compiles in ~50 ms on the 2-core CPU, a regex in < 1 ms, builtin JSON
# ~10 ms; validation in the tokenizer process has already rejected grammars that take over
# `runtime.support.grammar_check.CHECK_TIMEOUT_S` just to parse.
COMPILE_TIMEOUT_S = 10.0


class CompileTimeout(InvalidRequest):
    """The compile of a (valid) grammar ran out of time: fails its request, never cached."""


class JsonOptions(NamedTuple):
    any_whitespace: bool
    max_whitespace: int | None


def compile_spec(compiler: GrammarCompiler, spec: GrammarSpec, json_options: JsonOptions) -> CompiledGrammar:
    if spec.kind == "json":
        return compiler.compile_json_schema(
            spec.source, any_whitespace=json_options.any_whitespace,
            max_whitespace_cnt=json_options.max_whitespace if json_options.any_whitespace else None,
        )
    if spec.kind == "json_object":
        return compiler.compile_builtin_json_grammar()
    if spec.kind == "regex":
        return compiler.compile_regex(spec.source)
    return compiler.compile_grammar(spec.source)


def compile_main(conn: Connection, args: tuple[str, Callable[..., Any]]) -> None:
    """The helper: answer each (kind, source, json options) with (True, serialized grammar) or
    (False, error text). `args`: the tokenizer info (xgrammar's JSON) and the compile function."""
    import xgrammar as xgr

    info_json, compile_fn = args
    info = xgr.TokenizerInfo.deserialize_json(info_json)
    compiler = xgr.GrammarCompiler(info, max_threads=1, cache_enabled=False)

    def handle(request: tuple[str, str, JsonOptions]) -> tuple[bool, str]:
        kind, source, options = request
        try:
            return True, compile_fn(compiler, GrammarSpec(kind, source), options).serialize_json()  # type: ignore[arg-type]
        except Exception as e:  # noqa: BLE001  (any compile failure is the grammar's)
            return False, clean_error(e)

    serve(conn, handle)


class GrammarCompileWorker:
    """Compiles specs in the helper, one at a time (call from one thread: the backend's pool)."""

    def __init__(self, info: TokenizerInfo, timeout_s: float = COMPILE_TIMEOUT_S,
                 compile_fn: Callable[..., Any] = compile_spec) -> None:
        self.info = info
        self.timeout_s = timeout_s
        self.worker = KillableWorker(compile_main, (info.serialize_json(), compile_fn), "grammar-compile")

    def compile(self, spec: GrammarSpec, json_options: JsonOptions) -> CompiledGrammar:
        """The compiled grammar of `spec`; raises InvalidRequest (a CompileTimeout when late)."""
        import xgrammar as xgr

        try:
            ok, payload = self.worker.ask((spec.kind, spec.source, json_options), self.timeout_s)
        except TimeoutError:
            raise CompileTimeout(f"{spec.param} took longer than {self.timeout_s:g} s to compile; simplify it",
                                 param=spec.param) from None
        except EOFError:
            raise InvalidRequest(f"{spec.param} crashed the grammar compiler", param=spec.param) from None
        except RuntimeError as e:
            raise InvalidRequest(f"grammar-constrained decoding is unavailable: {e}", param=spec.param) from None
        if not ok:
            raise InvalidRequest(payload, param=spec.param)
        return xgr.CompiledGrammar.deserialize_json(payload, self.info)

    def close(self) -> None:
        self.worker.kill()
