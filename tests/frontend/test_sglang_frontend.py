"""SGLang's program frontend (sglang==0.4.6.post5: `sgl.function`, `gen`, `select`, `fork`,
`run_batch`, streaming, through `sgl.RuntimeEndpoint`) against our server.

The programs live in programs.py and run under .venv-frontend's python (our venv has no
sglang); they write what the frontend saw to a JSON file, section by section, and these tests
check it. `test_unconstrained_program` needs only the native API; `test_constrained_program`
needs constrained decoding (`regex` and `json_schema` in sampling_params). The two
`test_select_*` tests cover select's other choices methods, which read the input logprobs in
ways the default one does not.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

import pytest

from tests.frontend.conftest import run_programs, server_log_tail
from tests.tokenizer.http_helpers import RunningServer

pytestmark = pytest.mark.slow

CHAT_END = "<|im_end|>"  # the ChatML assistant suffix the frontend appends after each answer


@pytest.fixture(scope="module")
def programs(frontend_python: str, frontend_server: RunningServer,
             tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Both parts in one run of programs.py, one after the other as two runs would (one frontend
    start instead of two); each test reads only its own part's sections."""
    out = tmp_path_factory.mktemp("frontend") / "programs.json"
    return run_programs(frontend_python, frontend_server, "all", out)


@pytest.fixture(scope="module")
def unconstrained(programs: dict[str, Any]) -> dict[str, Any]:
    return programs


@pytest.fixture(scope="module")
def constrained(programs: dict[str, Any]) -> dict[str, Any]:
    return programs


class Problems:
    """Collects every failed check of every section, so one run reports all of them."""

    def __init__(self, results: dict[str, Any], server: RunningServer) -> None:
        self.results, self.server, self.items = results, server, []

    def section(self, name: str) -> dict[str, Any] | None:
        """The section's results, or None (and a problem with its traceback) if it raised."""
        entry = self.results["sections"].get(name)
        if entry is None:
            self.items.append(f"[{name}] did not run")
        elif not entry["ok"]:
            self.items.append(f"[{name}] raised {entry['error']}\n{entry['traceback']}")
        else:
            return entry
        return None

    def check(self, name: str, ok: bool, message: str) -> None:
        if not ok:
            self.items.append(f"[{name}] {message}")

    def assert_none(self) -> None:
        if self.items:
            pytest.fail("\n\n".join(self.items) + "\n\n--- programs.py output ---\n"
                        + self.results["program_output"][-3000:]
                        + "\n--- server log ---\n" + server_log_tail(self.server), pytrace=False)


def test_unconstrained_program(unconstrained: dict[str, Any], frontend_server: RunningServer,
                               default_model_path: str) -> None:
    p = Problems(unconstrained, frontend_server)

    if (ep := p.section("endpoint")) is not None:
        p.check("endpoint", ep["model_info"].get("model_path") == default_model_path,
                f"/get_model_info model_path: {ep['model_info']}")

    if (chat := p.section("chat_program")) is not None:
        _check_gen_with_stop(p, chat)
        _check_select(p, chat)
        tips = chat["tip"]
        p.check("fork", chat["fork_errors"] == [None, None],
                "a fork raised:\n" + "\n".join(e for e in chat["fork_errors"] if e))
        p.check("fork", isinstance(tips, list) and len(tips) == 2
                and all(isinstance(t, str) and t.strip() for t in tips),
                f"fork(2) + join should give a list of 2 non-empty strings: {tips!r}")
        p.check("fork", isinstance(tips, list) and not any(chat["tip_stop"] in t for t in tips),
                f"a forked gen kept its stop string {chat['tip_stop']!r}: {tips!r}")

    if (st := p.section("stream")) is not None:
        p.check("stream", len(st["chunks"]) > 3, f"only {len(st['chunks'])} chunks streamed")
        p.check("stream", st["joined"] == st["streamed_text"],
                f"text_iter() chunks {st['joined']!r} != final text {st['streamed_text']!r}")
        p.check("stream", st["streamed_answer"] == st["plain_answer"],
                f"streamed answer {st['streamed_answer']!r} != non-streamed "
                f"{st['plain_answer']!r}")
        p.check("stream", st["streamed_text"] == st["plain_text"],
                f"streamed text {st['streamed_text']!r} != non-streamed {st['plain_text']!r}")
        p.check("stream", bool(st["plain_answer"].strip()), "empty answer")

    if (batch := p.section("batch")) is not None:
        answers = batch["answers"]
        p.check("batch", len(answers) == 3 and all(isinstance(a, str) and a.strip()
                                                   for a in answers),
                f"run_batch over 3 inputs should give 3 non-empty answers: {answers!r}")
        p.check("batch", not any("\n" in a for a in answers),
                f"an answer kept its stop string '\\n': {answers!r}")
        p.check("batch", all(r and r["type"] in ("stop", "length")
                             for r in batch["finish_reasons"]),
                f"finish reasons: {batch['finish_reasons']!r}")

    p.assert_none()


@pytest.mark.xfail(strict=True, reason=(
    "we follow SGLang's logprob format (the entry at logprob_start_len is None); this method "
    "takes np.mean over every entry and fails with a TypeError against SGLang 0.4.6's own "
    "server in the same way"))
def test_select_greedy_token_selection(unconstrained: dict[str, Any],
                                       frontend_server: RunningServer) -> None:
    """`select(..., choices_method=sgl.greedy_token_selection)` compares the choices token by
    token; it takes the mean of every scored entry, so it needs a number (not None) for the
    first one, the token at logprob_start_len (SGLang's own server sends None there)."""
    p = Problems(unconstrained, frontend_server)
    if (entry := p.section("select_methods")) is not None:
        greedy = entry["greedy_token_selection"]
        p.check("greedy_token_selection", greedy["error"] is None, f"raised:\n{greedy['error']}")
        p.check("greedy_token_selection", greedy["capital"] in entry["choices"],
                f"chose {greedy['capital']!r}, not one of {entry['choices']}")
    p.assert_none()


@pytest.mark.xfail(strict=True, reason=(
    "we follow SGLang's logprob format (logprob_start_len -1 scores the last prompt token as "
    "[None, id, text]); the method's arithmetic then meets None and fails with a TypeError "
    "against SGLang 0.4.6's own server in the same way"))
def test_select_unconditional_likelihood_normalized(unconstrained: dict[str, Any],
                                                    frontend_server: RunningServer) -> None:
    p = Problems(unconstrained, frontend_server)
    if (entry := p.section("select_methods")) is not None:
        uncond = entry["unconditional_likelihood_normalized"]
        p.check("unconditional_likelihood_normalized", uncond["error"] is None,
                f"raised:\n{uncond['error']}")
        p.check("unconditional_likelihood_normalized", uncond["capital"] in entry["choices"],
                f"chose {uncond['capital']!r}, not one of {entry['choices']}")
    p.assert_none()


def _check_gen_with_stop(p: Problems, chat: dict[str, Any]) -> None:
    describe, stop = chat["describe"], chat["describe_stop"]
    p.check("gen", bool(describe.strip()), "gen with stop returned nothing")
    p.check("gen", stop not in describe, f"gen kept its stop string {stop!r}: {describe!r}")
    # The stop string ends the answer: nothing of the model's follows it in the program's text.
    p.check("gen", describe + CHAT_END in chat["text"],
            f"the answer is not followed by {CHAT_END!r} in the text: {chat['text']!r}")
    p.check("gen", chat["describe_finish_reason"] == {"type": "stop", "matched": stop},
            f"gen should finish on its stop string {stop!r}: {chat['describe_finish_reason']}")


def _check_select(p: Problems, chat: dict[str, Any]) -> None:
    choices, capital = chat["choices"], chat["capital"]
    scores = chat["normalized_prompt_logprobs"]
    p.check("select", capital in choices, f"select returned {capital!r}, not one of {choices}")
    if not (isinstance(scores, list) and len(scores) == len(choices)
            and all(isinstance(s, float) and math.isfinite(s) and s <= 0 for s in scores)):
        p.check("select", False, f"normalized_prompt_logprobs: {scores!r}")
        return
    best = choices[max(range(len(choices)), key=lambda i: scores[i])]
    p.check("select", capital == best,
            f"select chose {capital!r}, the argmax of {dict(zip(choices, scores))} is {best!r}")
    p.check("select", capital == "Paris", f"the capital of France: {capital!r} ({scores})")
    # The scored entries ([logprob, id, text]) cover each choice's tokens, texts included.
    for choice, entries in zip(choices, chat["input_token_logprobs"]):
        text = "".join(e[2] or "" for e in entries)
        p.check("select", text.endswith(choice),
                f"the scored tokens of {choice!r} read {text!r}: {entries}")
        values = [e[0] for e in entries if e[0]]
        p.check("select", bool(values) and all(isinstance(v, float) for v in values),
                f"input_token_logprobs of {choice!r}: {entries}")


def test_constrained_program(constrained: dict[str, Any], frontend_server: RunningServer) -> None:
    p = Problems(constrained, frontend_server)
    for name in ("regex_digits", "regex_email"):
        if (entry := p.section(name)) is not None:
            out, pattern = entry["output"], entry["constraint"]
            p.check(name, isinstance(out, str) and re.fullmatch(pattern, out) is not None,
                    f"{out!r} does not fullmatch {pattern!r} (finish: {entry['finish_reason']})")
    if (entry := p.section("json_schema")) is not None:
        out, schema = entry["output"], entry["constraint"]
        try:
            value = json.loads(out)
        except (TypeError, ValueError) as exc:
            p.check("json_schema", False, f"{out!r} is not JSON ({exc}); "
                                          f"finish: {entry['finish_reason']}")
        else:
            p.check("json_schema", isinstance(value, dict)
                    and set(schema["required"]) <= set(value),
                    f"{value!r} lacks a required key of {schema['required']}")
            if isinstance(value, dict):
                p.check("json_schema", set(value) <= set(schema["properties"]),
                        f"{value!r} has keys outside {sorted(schema['properties'])}")
                p.check("json_schema", isinstance(value.get("age"), int)
                        and isinstance(value.get("name"), str)
                        and isinstance(value.get("city"), str),
                        f"{value!r}: name and city must be strings, age an integer")
    p.assert_none()

