"""Grammars with the real default-model tokenizer: validation (runtime/support/grammar_check.py),
asynchronous compilation and its cache, and token-by-token drives through the mask kernel
(scheduler/grammar.py, kernels/grammar_mask.py)."""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest
import torch

from kernels.grammar_mask import apply_token_bitmask
from runtime.contracts.errors import InvalidRequest
from runtime.contracts.messages import GenerateReq
from runtime.contracts.sampling import SamplingParams
from runtime.support.grammar_check import (
    MAX_GRAMMAR_BYTES,
    GrammarChecker,
    GrammarSpec,
    default_checker,
    grammar_spec,
    validate_grammar,
    validate_grammar_async,
)
from scheduler.grammar import GrammarBackend, GrammarState, allocate_bitmask
from scheduler.grammar_compile import CompileTimeout
from scheduler.grammar_queue import GrammarQueue
from scheduler.request import Req
from tests.scheduler.slow_grammar import SLOW_MARKER, slow_build, slow_compile

VOCAB = 49152
EOS = 2
RESULT_TIMEOUT_S = 60.0
SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 6},
        "age": {"type": "integer", "minimum": 0, "maximum": 99},
        "kind": {"enum": ["cat", "dog"]},
        "tags": {"type": "array", "items": {"type": "boolean"}, "maxItems": 2},
        "address": {
            "type": "object",
            "properties": {"zip": {"type": "string", "pattern": "[0-9]{3}"}},
            "required": ["zip"],
        },
    },
    "required": ["name", "age", "kind", "address"],
}


@pytest.fixture(scope="module")
def tokenizer(default_model_path: str) -> Any:
    import transformers

    return transformers.AutoTokenizer.from_pretrained(default_model_path)


@pytest.fixture(scope="module")
def backend(tokenizer: Any) -> Iterator[GrammarBackend]:
    b = GrammarBackend(tokenizer, VOCAB, stop_token_ids=[EOS])
    yield b
    b.shutdown()


@pytest.fixture(scope="module")
def checker() -> Iterator[GrammarChecker]:
    c = default_checker()
    yield c
    c.close()


def compiled_state(backend: GrammarBackend, spec: GrammarSpec) -> GrammarState:
    return backend.new_state(backend.submit(spec).result(timeout=RESULT_TIMEOUT_S))


def drive_lowest(state: GrammarState, max_steps: int = 2000) -> list[int]:
    """A greedy "model" preferring low ids: logits -id, masked, argmax, accept; to termination."""
    bitmask = allocate_bitmask(2, VOCAB)
    ids: list[int] = []
    while not state.is_terminated():
        assert len(ids) < max_steps, f"no termination after {max_steps} tokens: {ids}"
        state.fill_mask(bitmask, 1)
        logits = -torch.arange(2 * VOCAB, dtype=torch.float32).view(2, VOCAB)
        apply_token_bitmask(logits, bitmask, [1])
        token = int(logits[1].argmax())
        assert state.accept(token), f"the mask allowed {token}, the matcher rejected it"
        ids.append(token)
    return ids


# --- grammar_spec and validation (tokenizer process) ---

@pytest.mark.parametrize("params,spec", [
    ({}, None),
    ({"json_schema": '{"type": "object"}'}, GrammarSpec("json", '{"type": "object"}')),
    ({"json_schema": "$$ANY$$"}, GrammarSpec("json_object", "$$ANY$$")),
    ({"regex": r"\d+"}, GrammarSpec("regex", r"\d+")),
    ({"ebnf": 'root ::= "a"'}, GrammarSpec("ebnf", 'root ::= "a"')),
])
def test_grammar_spec(params: dict[str, str], spec: GrammarSpec | None) -> None:
    assert grammar_spec(SamplingParams.from_dict(params)) == spec
    if spec is not None:
        assert {spec: 1}[GrammarSpec(spec.kind, spec.source)] == 1  # hashable cache key


@pytest.mark.parametrize("spec", [
    GrammarSpec("json", json.dumps(SCHEMA)),
    GrammarSpec("json", "true"),
    GrammarSpec("json_object", "$$ANY$$"),
    GrammarSpec("regex", r"\d{3}"),
    GrammarSpec("ebnf", 'root ::= "yes" | "no"'),
])
def test_validate_accepts_good_grammars(checker: GrammarChecker, spec: GrammarSpec) -> None:
    checker.validate(spec)
    validate_grammar(spec)  # the module-level form uses the same checker


@pytest.mark.parametrize("kind,source,needle", [
    ("json", '{"type": "object", "properties": {"a": {"type": "foo"}}}', 'Unsupported type "foo"'),
    ("json", '{"type": "string", "minLength": 5, "maxLength": 2}', "minLength 5 is greater"),
    ("json", '{"$ref": "#/defs/x"}', "Cannot find field"),
    ("json", '{"type": "string", "pattern": "[.*"}', "Unclosed '['"),
    ("json", "[1, 2]", "must be a JSON object or boolean"),
    ("json", "not json", "not valid JSON"),
    ("json", "", "must not be empty"),
    ("regex", "[.*", "Unclosed '['"),
    ("regex", "(a", "parenthesis is not closed"),
    ("regex", "a{3,1}", "Lower bound is larger than upper bound"),
    ("ebnf", "", "must not be empty"),
    ("ebnf", "root ::= foo", 'Rule "foo" is not defined'),
    ("ebnf", 'x ::= "a"', 'root rule with name "root" is not found'),
])
def test_validate_rejects_bad_grammars(
    checker: GrammarChecker, kind: str, source: str, needle: str
) -> None:
    spec = GrammarSpec(kind, source)  # type: ignore[arg-type]
    with pytest.raises(InvalidRequest) as info:
        checker.validate(spec)
    assert info.value.param == {"json": "json_schema"}.get(kind, kind)
    assert needle in info.value.message
    assert ".cc:" not in info.value.message  # xgrammar's source location is stripped


def test_validate_rejects_oversized_source(checker: GrammarChecker) -> None:
    schema = json.dumps({"type": "string", "description": "x" * MAX_GRAMMAR_BYTES})
    with pytest.raises(InvalidRequest, match="bytes; the limit is") as info:
        checker.validate(GrammarSpec("json", schema))
    assert info.value.param == "json_schema"


def test_validate_async(checker: GrammarChecker) -> None:
    asyncio.run(validate_grammar_async(GrammarSpec("regex", "[a-z]+")))
    with pytest.raises(InvalidRequest, match="Unclosed"):
        asyncio.run(validate_grammar_async(GrammarSpec("regex", "[.*")))


def test_slow_grammar_times_out_and_worker_recovers() -> None:
    """A build that outlasts the timeout (delay injected, so no CPU is fast enough to pass it):
    the worker is killed at the timeout, the next check runs on a fresh worker, and the timeout
    is not cached. (Each worker start costs seconds: the order below needs two, not three.)"""
    slow = json.dumps({"type": "string", "description": SLOW_MARKER})
    checker = GrammarChecker(timeout_s=0.3, build=slow_build)
    try:
        checker.start()
        with pytest.raises(InvalidRequest, match="took longer than 0.3 s") as info:
            checker.validate(GrammarSpec("json", slow))
        assert info.value.param == "json_schema"
        first_worker = checker._worker.proc
        assert first_worker is None  # killed at the timeout, not left building
        checker.timeout_s = 30.0  # the restart is not charged to the check, but be generous
        checker.validate(GrammarSpec("regex", r"\d+"))
        assert checker._worker.proc is not None and checker._worker.proc.is_alive()
        checker.timeout_s = 0.3
        with pytest.raises(InvalidRequest, match="took longer"):  # not cached: it timed out again
            checker.validate(GrammarSpec("json", slow))
        assert checker._worker.proc is None and GrammarSpec("json", slow) not in checker._verdicts
    finally:
        checker.close()


class FlakyWorker:
    """Stands in for the checker's worker: its first answer fails with `error` (as a helper
    timing out or crashing under load does), later ones are the real verdict (valid)."""

    def __init__(self, error: type[Exception]) -> None:
        self.error: type[Exception] | None = error
        self.asks = 0

    def ask(self, request: tuple[str, str], timeout_s: float) -> str | None:
        self.asks += 1
        if self.error is not None:
            error, self.error = self.error, None
            raise error
        return "bad grammar" if request[1] == "bad" else None


@pytest.mark.parametrize("failure,message", [(TimeoutError, "took longer"), (EOFError, "crashed")])
def test_a_timeout_or_crash_is_not_cached_as_a_verdict(failure: type[Exception], message: str) -> None:
    checker = GrammarChecker(timeout_s=0.3)
    worker = FlakyWorker(failure)
    checker._worker = worker  # type: ignore[assignment]
    spec = GrammarSpec("regex", "[0-9]+")
    with pytest.raises(InvalidRequest, match=message):
        checker.validate(spec)
    checker.validate(spec)  # accepted: the failure was the helper's, not the grammar's
    checker.validate(spec)  # this verdict is cached
    assert worker.asks == 2
    for _ in range(2):  # a genuine error is a verdict: cached too
        with pytest.raises(InvalidRequest, match="bad grammar"):
            checker.validate(GrammarSpec("regex", "bad"))
    assert worker.asks == 3


def test_worker_that_died_while_idle_is_restarted(checker: GrammarChecker) -> None:
    checker.validate(GrammarSpec("regex", "[0-9]+"))
    proc = checker._worker.proc
    assert proc is not None
    proc.kill()
    proc.join()
    checker.validate(GrammarSpec("regex", "[0-9]*x"))  # not cached: needs the worker
    assert checker._worker.proc is not None and checker._worker.proc.is_alive()


def test_checker_keeps_torch_and_xgrammar_out_of_the_caller() -> None:
    code = ("import sys; from runtime.support.grammar_check import GrammarChecker, GrammarSpec; "
            "c = GrammarChecker(); c.validate(GrammarSpec('regex', 'a+')); c.close(); "
            "assert 'torch' not in sys.modules and 'xgrammar' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


# --- compilation and its cache (scheduler) ---

def test_cache_returns_the_same_future(backend: GrammarBackend) -> None:
    spec = GrammarSpec("regex", r"[ab]{2}")
    first = backend.submit(spec)
    assert backend.submit(GrammarSpec("regex", r"[ab]{2}")) is first
    assert backend.submit(GrammarSpec("regex", r"[ab]{3}")) is not first
    first.result(timeout=RESULT_TIMEOUT_S)
    backend.reset()
    assert backend.submit(spec) is not first


def test_failing_spec_future_raises_and_is_cached(backend: GrammarBackend) -> None:
    spec = GrammarSpec("regex", "[.*")
    future = backend.submit(spec)
    with pytest.raises(InvalidRequest, match="Unclosed") as info:
        future.result(timeout=RESULT_TIMEOUT_S)
    assert info.value.param == "regex"
    assert backend.submit(spec) is future


def test_a_compile_past_its_timeout_fails_only_its_request_and_is_not_cached(tokenizer: Any) -> None:
    """The compile helper is killed when a compile runs late: that spec's future raises a
    CompileTimeout naming the field, the queue forgets it (asked again, it compiles again), and
    the next spec compiles in a fresh helper."""
    backend = GrammarBackend(tokenizer, VOCAB, stop_token_ids=[EOS], compile_timeout_s=1.0, compile_fn=slow_compile)
    queue = GrammarQueue(lambda: backend)
    try:
        slow = Req.from_message(GenerateReq("slow", [1], SamplingParams(regex=f"{SLOW_MARKER}|x")), frozenset())
        fast = Req.from_message(GenerateReq("fast", [1], SamplingParams(regex="[ab]{2}")), frozenset())
        assert queue.submit(slow) and queue.submit(fast)  # fast queues behind slow in the helper
        deadline = time.monotonic() + 120
        ready, failed = [], []
        while len(ready) + len(failed) < 2 and time.monotonic() < deadline:
            got = queue.poll()
            ready += got[0]
            failed += got[1]
            time.sleep(0.05)
        assert [r.rid for r in ready] == ["fast"]  # its own countdown started when it did
        (req, error), = failed
        assert req.rid == "slow" and isinstance(error, CompileTimeout) and error.param == "regex"
        assert "took longer than 1 s to compile" in error.message
        again = backend.submit(GrammarSpec("regex", f"{SLOW_MARKER}|x"))
        assert again is not slow.grammar_future  # forgotten, not cached as failed
    finally:
        backend.shutdown()


def test_cache_is_lru_bounded(backend: GrammarBackend, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(backend, "cache_entries", 2)
    a, b, c = (GrammarSpec("regex", s) for s in ("x", "y", "z"))
    fa, fb = backend.submit(a), backend.submit(b)
    assert backend.submit(a) is fa  # a is now the most recent
    backend.submit(c)  # evicts b
    assert backend.submit(a) is fa
    assert backend.submit(b) is not fb


# --- token-by-token drives ---

def test_regex_drive_and_termination(backend: GrammarBackend, tokenizer: Any) -> None:
    state = compiled_state(backend, GrammarSpec("regex", r"\d{3}"))
    first_allowed = state.allowed_ids()
    assert first_allowed and EOS not in first_allowed
    assert not state.accept(tokenizer.convert_tokens_to_ids("a"))  # rejected; state unchanged
    ids = drive_lowest(state)
    assert ids[0] == first_allowed[0]
    assert ids[-1] == EOS and EOS not in ids[:-1]
    assert re.fullmatch(r"\d{3}", tokenizer.decode(ids[:-1]))
    assert state.is_terminated() and not state.accept(EOS)


def test_stop_token_only_after_completion(backend: GrammarBackend, tokenizer: Any) -> None:
    state = compiled_state(backend, GrammarSpec("regex", r"\d{3}"))
    for t in tokenizer.encode("12", add_special_tokens=False):
        assert state.accept(t)
    assert not state.is_completed() and EOS not in state.allowed_ids()
    for t in tokenizer.encode("3", add_special_tokens=False):
        assert state.accept(t)
    assert state.is_completed() and not state.is_terminated()
    assert state.allowed_ids() == [EOS]
    assert state.accept(EOS) and state.is_terminated()


def test_json_schema_drive(backend: GrammarBackend, tokenizer: Any) -> None:
    state = compiled_state(backend, GrammarSpec("json", json.dumps(SCHEMA)))
    ids = drive_lowest(state)
    assert ids[-1] == EOS
    obj = json.loads(tokenizer.decode(ids[:-1]))
    assert set(SCHEMA["required"]) <= set(obj)  # type: ignore[arg-type]
    assert isinstance(obj["name"], str) and len(obj["name"]) <= 6
    assert isinstance(obj["age"], int) and 0 <= obj["age"] <= 99
    assert obj["kind"] in ("cat", "dog")
    assert re.fullmatch(r"[0-9]{3}", obj["address"]["zip"])


def test_ebnf_drive(backend: GrammarBackend, tokenizer: Any) -> None:
    state = compiled_state(backend, GrammarSpec("ebnf", 'root ::= "yes" | "no"'))
    ids = drive_lowest(state)
    assert tokenizer.decode(ids[:-1]) in ("yes", "no")


@pytest.mark.parametrize("text,ok", [('{"a": [1, 2.5, "x"]}', True), ("[true, null]", True),
                                     ('"just a string"', False), ("3", False)])
def test_any_json_is_an_object_or_array(
    backend: GrammarBackend, tokenizer: Any, text: str, ok: bool
) -> None:
    state = compiled_state(backend, GrammarSpec("json_object", "$$ANY$$"))
    accepted = all(state.accept(t) for t in tokenizer.encode(text, add_special_tokens=False))
    assert accepted == ok
    if ok:
        assert state.accept(EOS) and state.is_terminated()


def test_override_stop_tokens(backend: GrammarBackend, tokenizer: Any) -> None:
    compiled = backend.submit(GrammarSpec("regex", "a")).result(timeout=RESULT_TIMEOUT_S)
    state = backend.new_state(compiled, stop_token_ids=[0])
    assert state.accept(tokenizer.convert_tokens_to_ids("a"))
    assert state.allowed_ids() == [0]


@pytest.mark.parametrize("bound,spaces_ok", [(None, 40), (2, 2)])
def test_json_whitespace_bound(
    backend: GrammarBackend, tokenizer: Any, monkeypatch: pytest.MonkeyPatch,
    bound: int | None, spaces_ok: int,
) -> None:
    monkeypatch.setattr(backend, "max_whitespace", bound)
    schema = json.dumps({"title": f"ws{bound}", "type": "object",
                         "properties": {"a": {"type": "integer"}}, "required": ["a"]})
    state = compiled_state(backend, GrammarSpec("json", schema))
    space = tokenizer.convert_tokens_to_ids("Ġ")
    assert state.accept(tokenizer.convert_tokens_to_ids("{"))
    assert all(state.accept(space) for _ in range(spaces_ok))
    if bound is not None:
        assert not state.accept(space)


def test_an_error_at_a_non_ascii_character_is_a_clear_400() -> None:
    """xgrammar cuts its message inside the character; the verdict names the field instead of
    quoting a UTF-8 decode error (found by the schemathesis run)."""
    with pytest.raises(InvalidRequest) as err:
        validate_grammar(GrammarSpec("ebnf", 'root ::= "a" \u00c2'))
    assert err.value.param == "ebnf" and "codec" not in str(err.value), str(err.value)
