"""Schemathesis against the real server (issue 18): every operation of its own /openapi.json,
with bodies that fit the document (positive) and bodies that break it (negative), seeded and
bounded, then the server must be alive, idle and sound.

    .venv/bin/python -m pytest -q -s tests/tokenizer/test_fuzz_schemathesis.py
    RADIXSERVE_FUZZ_EXAMPLES=3000 RADIXSERVE_FUZZ_SEED=7 .venv/bin/python -m pytest -q -s ...

Checks on every answer: no 5xx (`not_a_server_error`), a documented status, a documented content
type, a body that fits the documented answer, and no 5xx error event inside a 200 stream. The
server runs with small caps (context 160 tokens, n <= 2, 4 prompts, 5 top logprobs), which the
field specs leave to the runtime's checks (a fitting body past them is a 400), and
--request-timeout 0.3: a long generation ends with finish reason abort after 0.3 s (a few tokens in),
so the deadline path is fuzzed too and every example
is quick (most generations end at that deadline: its length is the cost of an example). A fitting
body's own longer `timeout` is cut to 0.3 s for the same reason; the final soundness check sends
a huge one.
Nothing is excluded: /abort_request and /flush_cache act on an idle server between examples;
GET /openapi.json is fetched and validated, not fuzzed (schemathesis skips the operation that
serves the document it reads; test_openapi.py covers the route).
Examples: 200 in all by default, 300 with RADIXSERVE_FULL_TESTS=1 (RADIXSERVE_FUZZ_EXAMPLES sets
any count): one per operation without a body; the rest split by WEIGHTS, half positive, half
negative. The report (printed with -s) lists per operation the examples and statuses, and the
fitting bodies refused with a 400 (rules a schema cannot express: a prompt longer than the
context, per-prompt lists of the wrong length, an invalid grammar...).
"""

from __future__ import annotations

import collections
import os
import time
from collections.abc import Iterator
from typing import Any

import hypothesis
import orjson
import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, Phase
from schemathesis import GenerationMode
from schemathesis.checks import (  # type: ignore[attr-defined]
    content_type_conformance,
    not_a_server_error,
    response_schema_conformance,
    status_code_conformance,
)

from tests import FULL_TESTS
from tests.tokenizer.http_helpers import RunningServer, post, server_state, wait_idle

pytestmark = pytest.mark.slow

SEED = int(os.environ.get("RADIXSERVE_FUZZ_SEED", "18"))
TOTAL_EXAMPLES = int(os.environ.get("RADIXSERVE_FUZZ_EXAMPLES", "300" if FULL_TESTS else "200"))
DEADLINE_S = 0.3  # the server's --request-timeout
SERVER_ARGS = ("--context-length", "160", "--max-n", "2", "--max-prompts-per-request", "4",
               "--max-top-logprobs", "5", "--request-timeout", str(DEADLINE_S))
# Shares of the examples for operations with a body (one example covers an operation without).
WEIGHTS = {"POST /generate": 3, "POST /v1/completions": 3, "POST /v1/chat/completions": 3, "POST /v1/responses": 3}
REQUEST_TIMEOUT_S = 60


def no_error_event_above_499(ctx: Any, response: Any, case: Any) -> None:
    """A streamed 200 carries a later error as an event: it must not be a server error."""
    if "text/event-stream" not in response.headers.get("content-type", [""])[0]:
        return
    for line in response.content.splitlines():
        if line.startswith(b"data: {") and b'"error"' in line:
            error = orjson.loads(line[len(b"data: "):]).get("error") or {}
            assert int(error.get("code", 0)) < 500, f"server error event: {line[:300]!r}"


CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance,
          response_schema_conformance, no_error_event_above_499]


@pytest.fixture(scope="module")
def server(default_model_path: str) -> Iterator[RunningServer]:
    with RunningServer.start(default_model_path, *SERVER_ARGS) as running:
        yield running


def _budgets(operations: list[Any]) -> dict[str, int]:
    """Examples per operation: one for each without a body, the rest split by WEIGHTS."""
    with_body = [op.label for op in operations if op.body]
    spare = max(TOTAL_EXAMPLES - (len(operations) - len(with_body)), len(with_body))
    units = sum(WEIGHTS.get(label, 1) for label in with_body)
    out = {op.label: 1 for op in operations if not op.body}
    out.update({label: max(2, spare * WEIGHTS.get(label, 1) // units) for label in with_body})
    return out


def _deadline_kept(body: Any) -> Any:
    """A fitting body's own `timeout` (which overrides the server's) cut to DEADLINE_S: with a
    long one an example could run its prompts to their full length (4 prompts x 128 tokens took
    half a minute). A huge valid timeout is sent by `_assert_sound` instead."""
    timeout = body.get("timeout") if isinstance(body, dict) else None
    if isinstance(timeout, (int, float)) and not isinstance(timeout, bool) and timeout > DEADLINE_S:
        return {**body, "timeout": DEADLINE_S}
    return body


def _whole_floats_as_ints(value: Any) -> Any:
    """`2.0` -> `2` at every depth. NOTE: JSON Schema counts 2.0 as an integer and schemathesis
    sends it so; the validators refuse it (a 400 naming the field), so a fitting body would
    rarely reach the runtime. Negative bodies keep what was generated."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, list):
        return [_whole_floats_as_ints(v) for v in value]
    if isinstance(value, dict):
        return {k: _whole_floats_as_ints(v) for k, v in value.items()}
    return value


class Tally:
    """Examples sent and statuses received, per operation; failures by operation."""

    def __init__(self) -> None:
        self.statuses: dict[str, collections.Counter[int]] = collections.defaultdict(
            collections.Counter)
        self.refused: collections.Counter[str] = collections.Counter()  # positive 400s by param
        self.failures: dict[str, str] = {}

    def record(self, label: str, mode: GenerationMode, response: requests.Response) -> None:
        self.statuses[label][response.status_code] += 1
        if mode is GenerationMode.POSITIVE and response.status_code == 400:
            error = response.json()["error"]  # Anthropic's shape (/v1/messages) has no param
            self.refused[f"{label} {error.get('param')}: {error['message'][:60]}"] += 1

    def report(self, elapsed: float) -> str:
        sent = sum(sum(c.values()) for c in self.statuses.values())
        rows = [(f"schemathesis {schemathesis.__version__}, seed {SEED}, {TOTAL_EXAMPLES} "
                 f"examples asked, {sent} sent in {elapsed:.0f} s, {len(self.failures)} failures")]
        rows += [f"{label:28} {sum(c.values()):4}  "
                 + " ".join(f"{s}:{n}" for s, n in sorted(c.items()))
                 for label, c in self.statuses.items()]
        rows.append("bodies that fit the document, refused (400) by a check it cannot express:")
        rows += [f"{n:4} {key}" for key, n in self.refused.most_common()]
        return "\n".join(rows)


def _fuzz(op: Any, mode: GenerationMode, examples: int, session: requests.Session,
          tally: Tally) -> None:
    @hypothesis.seed(SEED)
    @hypothesis.settings(max_examples=examples, deadline=None, database=None, print_blob=False,
                         suppress_health_check=list(HealthCheck),
                         phases=[Phase.explicit, Phase.generate, Phase.shrink])
    @hypothesis.given(case=op.as_strategy(generation_mode=mode))
    def run(case: Any) -> None:
        if mode is GenerationMode.POSITIVE:
            case.body = _deadline_kept(_whole_floats_as_ints(case.body))
        response = case.call(session=session, timeout=REQUEST_TIMEOUT_S)
        tally.record(op.label, mode, response)
        case.validate_response(response, checks=CHECKS)

    run()


def test_every_operation_survives_the_fuzzer(server: RunningServer) -> None:
    start = time.monotonic()
    schema = schemathesis.openapi.from_url(server.url + "/openapi.json")
    schema.validate()  # NOTE: schemathesis skips the operation serving its own document
    operations = [result.ok() for result in schema.get_all_operations()]
    budgets, tally = _budgets(operations), Tally()
    with requests.Session() as session:
        for op in operations:
            modes = [GenerationMode.POSITIVE] + ([GenerationMode.NEGATIVE] if op.body else [])
            for mode in modes:
                try:
                    _fuzz(op, mode, max(1, budgets[op.label] // len(modes)), session, tally)
                # NOTE: one operation's failure must not hide the others'.
                except Exception as exc:  # noqa: BLE001
                    tally.failures[f"{op.label} ({mode.value})"] = str(exc)[:4000]
    print("\n" + tally.report(time.monotonic() - start))
    assert not tally.failures, "\n\n".join(f"{k}:\n{v}" for k, v in tally.failures.items())
    _assert_sound(server)


def _assert_sound(server: RunningServer) -> None:
    """Alive, healthy, idle, nothing held, and a plain request still answers."""
    assert server.process.poll() is None, server.log()[-5000:]
    assert requests.get(server.url + "/health", timeout=10).status_code == 200
    state = wait_idle(server, timeout=30)
    assert state["integrity"] == "ok", state
    assert state["rows_free"] == state["rows_total"], state
    assert state["kv_protected"] == 0, state
    assert state["kv_available"] + state["kv_evictable"] == state["kv_total"], state
    info = requests.get(server.url + "/get_server_info", timeout=10).json()
    assert info["requests_in_flight"] == 0, info
    # A huge timeout is valid (and spares this request the server's short deadline).
    out = post(server, "/generate", {"text": "Hello", "timeout": 7.8e13, "sampling_params": {"max_new_tokens": 2}})
    assert out.status_code == 200 and out.json()["meta_info"]["completion_tokens"] >= 1
    assert server_state(server)["integrity"] == "ok"
