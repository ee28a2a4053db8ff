"""Grammar constraints of a request (`json_schema`, `regex`, `ebnf`): the cache key the scheduler
compiles by, and the validation the tokenizer process runs so that a bad grammar is a 400 before
anything reaches the scheduler.

    spec = grammar_spec(sampling_params)        # None: unconstrained
    if spec is not None:
        await validate_grammar_async(spec)      # raises InvalidRequest naming the field

Validation builds the tokenizer-free `xgrammar.Grammar` (`from_json_schema` / `from_regex` /
`from_ebnf`), which parses the source and reports xgrammar's own error text. It runs in a
persistent worker **process** (spawn), started on first use, with a timeout of `CHECK_TIMEOUT_S`
per check; on timeout the worker is killed and the next check starts a fresh one. A process, not
a thread, because:
  - a construction cannot be interrupted from Python, and some are unbounded in practice: a JSON
    schema of arrays nested 1000 deep (25 KB of text) builds for over 20 s; a thread would keep
    pinning a core after its caller gave up, and a second one would pile up behind it;
  - a C++ crash in xgrammar (a segfault or abort on some input) kills the worker, not the
    server; the spec gets a 400 and the next check starts a fresh worker;
  - importing xgrammar imports torch; the main process stays free of both.
A check costs one pipe round trip plus the build (well under 1 ms for typical inputs); the worker
costs ~330 MB resident and 2-4 s to start (call `default_checker().start()` at launch to keep
that off the first grammar request). xgrammar does release the GIL while building, so a thread
would not block the event loop, but the points above still stand. Verdicts
(built, or xgrammar's error) are kept in an LRU keyed by spec, so a repeated schema skips the
worker. A timeout or a crash is refused but not cached: under load a valid schema can time out
once, and must not stay refused; a repeated pathological one costs its timeout (and a worker
restart) each time. Checks are serialized on the one worker: a slow spec delays other grammar
checks by at most `CHECK_TIMEOUT_S`, and never requests without a grammar (the async form waits
on a thread, off the event loop).

`$$ANY$$` as `json_schema` (SGLang's sentinel for OpenAI `response_format: json_object`) is kind
"json_object": xgrammar's builtin JSON grammar, whose root is any JSON object or array.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import threading
from collections import OrderedDict
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any, Literal, NamedTuple

from runtime.contracts.errors import InvalidRequest
from runtime.contracts.sampling import ANY_JSON, SamplingParams
from runtime.support.worker_process import KillableWorker, serve

MAX_GRAMMAR_BYTES = 64 * 1024  # UTF-8 bytes of one grammar source
# One build. Typical inputs take < 1 ms (a 6-field schema: 0.5 ms including the pipe); arrays
# nested 100 deep ~0.15 s, 200 deep 0.8 s, 300 deep 2.8 s (cubic), 1000 deep > 20 s.
CHECK_TIMEOUT_S = 2.0
START_TIMEOUT_S = 60.0  # worker start (imports xgrammar and torch: 2-4 s, longer under load)
VERDICT_CACHE_ENTRIES = 512

GrammarKind = Literal["json", "json_object", "regex", "ebnf"]
_PARAM: dict[str, str] = {
    "json": "json_schema", "json_object": "json_schema", "regex": "regex", "ebnf": "ebnf",
}
# xgrammar prefixes errors with "[hh:mm:ss] /path/file.cc:123: " and sometimes a failed check.
_XGR_PREFIX = re.compile(r"^\[[0-9:]+\] \S+:\d+: (Check failed: .*? is false: )?")


class GrammarSpec(NamedTuple):
    """One request's grammar: hashable, used as the compile cache key."""

    kind: GrammarKind
    source: str

    @property
    def param(self) -> str:
        """The sampling parameter the grammar came from (for error messages)."""
        return _PARAM[self.kind]


def grammar_spec(sp: SamplingParams) -> GrammarSpec | None:
    """The grammar constraint of `sp`, or None. `sp.validate()` already rejects two at once."""
    if sp.json_schema is not None:
        if sp.json_schema == ANY_JSON:
            return GrammarSpec("json_object", ANY_JSON)
        return GrammarSpec("json", sp.json_schema)
    if sp.regex is not None:
        return GrammarSpec("regex", sp.regex)
    if sp.ebnf is not None:
        return GrammarSpec("ebnf", sp.ebnf)
    return None


def clean_error(exc: BaseException | str) -> str:
    """xgrammar's error text without its timestamp and source-location prefix."""
    text = str(exc).strip()
    return _XGR_PREFIX.sub("", text).strip() or type(exc).__name__


def build_grammar(spec: GrammarSpec) -> Any:
    """Build the tokenizer-free `xgrammar.Grammar` of `spec` (raises xgrammar's RuntimeError)."""
    import xgrammar as xgr

    if spec.kind == "json":
        return xgr.Grammar.from_json_schema(spec.source)
    if spec.kind == "json_object":
        return xgr.Grammar.builtin_json_grammar()
    if spec.kind == "regex":
        return xgr.Grammar.from_regex(spec.source)
    return xgr.Grammar.from_ebnf(spec.source)


def precheck(spec: GrammarSpec) -> str | None:
    """The checks that need no xgrammar: an error message, or None."""
    if spec.kind == "json_object":
        return None
    if not spec.source.strip():
        return f"{spec.param} must not be empty"
    size = len(spec.source.encode("utf-8", "surrogatepass"))
    if size > MAX_GRAMMAR_BYTES:
        return f"{spec.param} is {size} bytes; the limit is {MAX_GRAMMAR_BYTES}"
    if spec.kind == "json":
        try:
            schema = json.loads(spec.source)
        except RecursionError:
            return "json_schema is nested too deeply"
        except ValueError as e:
            return f"json_schema is not valid JSON: {e}"
        if not isinstance(schema, (dict, bool)):
            return f"json_schema must be a JSON object or boolean, got {type(schema).__name__}"
    return None


def _worker_main(conn: Connection, build: Callable[[GrammarSpec], Any] = build_grammar) -> None:
    """Worker: answer each (kind, source) with None (valid) or the error text.

    `build` is `build_grammar`; tests pass a module-level function that adds a delay."""
    import xgrammar  # noqa: F401  (imported before "ready": the first check is not charged for it)

    def check(request: tuple[GrammarKind, str]) -> str | None:
        try:
            build(GrammarSpec(*request))
            return None
        except UnicodeDecodeError:  # xgrammar cut its message inside a non-ASCII character
            return f"{GrammarSpec(*request).param} is not a valid grammar (the error is at a non-ASCII character)"
        except Exception as e:  # noqa: BLE001  (any failure is the grammar's verdict)
            return clean_error(e)

    serve(conn, check)


class GrammarChecker:
    """Validates grammar specs in a worker process, under a timeout, with an LRU of verdicts.

    Thread-safe: checks from several threads queue for the one worker. `build` runs in the
    worker (a picklable module-level function; tests inject a slow one).
    """

    def __init__(
        self,
        timeout_s: float = CHECK_TIMEOUT_S,
        cache_entries: int = VERDICT_CACHE_ENTRIES,
        build: Callable[[GrammarSpec], Any] = build_grammar,
    ) -> None:
        self.timeout_s = timeout_s
        self.cache_entries = cache_entries
        self._verdicts: OrderedDict[GrammarSpec, str | None] = OrderedDict()
        self._cache_lock = threading.Lock()
        self._worker_lock = threading.Lock()
        self._worker = KillableWorker(_worker_main, build, "grammar-check", START_TIMEOUT_S)

    def validate(self, spec: GrammarSpec) -> None:
        """Raise `InvalidRequest` (param: the grammar's field) when `spec` is not a valid grammar.

        Raises:
            InvalidRequest: bad source, xgrammar rejected it, it took over `timeout_s` to build,
                it crashed the worker, or the worker could not start (grammars unavailable).
        """
        error = precheck(spec)
        if error is None:
            error = self._verdict(spec)
        if error is not None:
            raise InvalidRequest(error, param=spec.param)

    def start(self) -> None:
        """Start the worker now (optional: the first check does it) to keep its start-up off
        the first grammar request's latency."""
        # A failure to start is reported by the next check, which retries.
        with self._worker_lock, contextlib.suppress(RuntimeError, OSError):
            self._worker.ensure_started()

    def close(self) -> None:
        """Stop the worker (a later check starts a new one)."""
        with self._worker_lock:
            self._worker.kill()

    def _verdict(self, spec: GrammarSpec) -> str | None:
        with self._cache_lock:
            if spec in self._verdicts:
                self._verdicts.move_to_end(spec)
                return self._verdicts[spec]
        # NOTE: only a verdict the build itself gave is cached. A timeout or a crash may be the
        # load's doing, not the grammar's, and the worker's failure to start is neither.
        try:
            with self._worker_lock:
                verdict = self._worker.ask((spec.kind, spec.source), self.timeout_s)
        except TimeoutError:
            return f"{spec.param} took longer than {self.timeout_s:g} s to build; simplify it"
        except EOFError:
            return f"{spec.param} crashed the grammar validator"
        except (RuntimeError, OSError) as e:
            return f"grammar-constrained decoding is unavailable: {e}"
        with self._cache_lock:
            self._verdicts[spec] = verdict
            while len(self._verdicts) > self.cache_entries:
                self._verdicts.popitem(last=False)
        return verdict


_default: GrammarChecker | None = None
_default_lock = threading.Lock()


def default_checker() -> GrammarChecker:
    """The process-wide checker (created on first use; its worker starts on first check)."""
    global _default
    with _default_lock:
        if _default is None:
            _default = GrammarChecker()
        return _default


def validate_grammar(spec: GrammarSpec) -> None:
    """Blocking validation with the process-wide checker; see `GrammarChecker.validate`."""
    default_checker().validate(spec)


async def validate_grammar_async(spec: GrammarSpec) -> None:
    """`validate_grammar` for an event loop: the cheap checks inline, the wait on a thread."""
    error = precheck(spec)
    if error is not None:
        raise InvalidRequest(error, param=spec.param)
    await asyncio.to_thread(validate_grammar, spec)
