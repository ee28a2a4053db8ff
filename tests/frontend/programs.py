"""SGLang frontend programs run against a radixserve server (by tests/frontend).

    .venv-frontend/bin/python tests/frontend/programs.py --url http://127.0.0.1:PORT \
        --out RESULT.json [--part unconstrained|constrained|all]

This file runs under the frontend venv's python (sglang==0.4.6.post5 without its runtime, see
scripts/setup_frontend_venv.sh), never under pytest: our venv has no sglang.

Every program goes through `sgl.RuntimeEndpoint(url)` and `sgl.set_default_backend`, greedy
(temperature 0). Each section runs on its own; a failure is recorded as
`{"ok": false, "error": ..., "traceback": ...}` and the next section still runs. The JSON file is
rewritten after every section (`"running"` names the section in progress), so a run killed by a
timeout still shows how far it got.

Sections:
- unconstrained: `endpoint` (/get_model_info, /flush_cache, /get_server_info), `chat_program`
  (system/user/assistant, gen with stop, select, fork(2) + join), `select_methods` (select
  with greedy_token_selection and unconditional_likelihood_normalized), `stream` (text_iter() vs. a
  non-streamed run), `batch` (run_batch over 3 inputs).
- constrained: `regex_digits` (regex \\d{3}), `regex_email`, `json_schema`.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
import traceback
from collections.abc import Callable
from typing import Any

import sglang as sgl

# SmolLM2 (the default model) is a ChatML model; 0.4.6.post5 only recognizes ChatML from names
# like "tinyllama" or "qwen", so name the template (the constructor still calls /get_model_info).
CHAT_TEMPLATE = "chatml"

STOP_SENTENCE = "."
STOP_LINE = "\n"
CAPITAL_CHOICES = ["Paris", "London", "Berlin"]
BATCH_QUESTIONS = ["What is the capital of Italy?", "What is the capital of Spain?",
                   "What is the capital of Japan?"]

REGEX_DIGITS = r"\d{3}"
# Bounded, so that the constrained output always completes within max_tokens.
REGEX_EMAIL = r"[a-z]{1,12}\.[a-z]{1,12}@[a-z]{2,12}\.(com|org|net)"
JSON_SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 24},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "city": {"type": "string", "maxLength": 24},
    },
    "required": ["name", "age", "city"],
    "additionalProperties": False,
}

SYSTEM = "You are a helpful assistant. Answer briefly."


# ---------------------------------------------------------------- programs


@sgl.function
def chat_program(s, city):
    s += sgl.system(SYSTEM)
    s += sgl.user(f"Describe {city} in one sentence.")
    s += sgl.assistant(sgl.gen("describe", max_tokens=48, stop=STOP_SENTENCE))
    s += sgl.user("What is the capital of France?")
    s += sgl.assistant(sgl.select("capital", choices=CAPITAL_CHOICES))
    forks = s.fork(2)
    forks += lambda i: sgl.user(f"Give tip number {i + 1} for visiting {city}, in one sentence.")
    forks += sgl.assistant(sgl.gen("tip", max_tokens=32, stop=STOP_LINE))
    forks.join()
    # A fork's failure leaves only its executor's error; keep it for the report.
    s["fork_errors"] = [_error_text(f.error()) for f in forks.states]


@sgl.function
def select_program(s, method):
    s += sgl.system(SYSTEM)
    s += sgl.user("What is the capital of France?")
    s += sgl.assistant(sgl.select("capital", choices=CAPITAL_CHOICES, choices_method=method))


@sgl.function
def answer_program(s, question):
    s += sgl.system(SYSTEM)
    s += sgl.user(question)
    s += sgl.assistant(sgl.gen("answer", max_tokens=24))


@sgl.function
def batch_program(s, question):
    s += sgl.system(SYSTEM)
    s += sgl.user(question)
    s += sgl.assistant(sgl.gen("answer", max_tokens=16, stop=STOP_LINE))


@sgl.function
def digits_program(s):
    s += sgl.user("Give me a three-digit number.")
    s += sgl.assistant(sgl.gen("number", max_tokens=8, regex=REGEX_DIGITS))


@sgl.function
def email_program(s):
    s += sgl.user("Write the e-mail address of John Smith.")
    s += sgl.assistant(sgl.gen("email", max_tokens=48, regex=REGEX_EMAIL))


@sgl.function
def json_program(s):
    s += sgl.user("Describe a person as JSON with the keys name, age and city.")
    s += sgl.assistant(sgl.gen("person", max_tokens=96, json_schema=json.dumps(JSON_SCHEMA)))


# ---------------------------------------------------------------- sections


def _error_text(err: BaseException | None) -> str | None:
    if err is None:
        return None
    return "".join(traceback.format_exception(err))


def _check(state: Any) -> None:
    """Raise the error the program's executor thread hit (the frontend only stores it)."""
    err = state.error()
    if err is not None:
        raise err


def _finish(meta: Any) -> Any:
    return meta.get("finish_reason") if isinstance(meta, dict) else None


def section_endpoint(backend: Any) -> dict[str, Any]:
    backend.flush_cache()  # POST /flush_cache (the server is idle: nothing runs yet)
    info = backend.get_server_info()
    return {"model_info": backend.model_info, "chat_template": backend.chat_template.name,
            "flushed": True, "server_info_keys": sorted(info)}


def section_chat_program(backend: Any) -> dict[str, Any]:
    state = chat_program.run(city="Paris", temperature=0)
    _check(state)
    select_meta = state.get_meta_info("capital") or {}
    return {
        "text": state.text(),
        "describe": state["describe"],
        "describe_stop": STOP_SENTENCE,
        "describe_finish_reason": _finish(state.get_meta_info("describe")),
        "capital": state["capital"],
        "choices": CAPITAL_CHOICES,
        # TokenLengthNormalized: the mean input logprob of each choice's tokens.
        "normalized_prompt_logprobs": select_meta.get("normalized_prompt_logprobs"),
        "input_token_logprobs": select_meta.get("input_token_logprobs"),
        "tip": state["tip"],
        "tip_stop": STOP_LINE,
        "fork_errors": state["fork_errors"],
    }


def section_select_methods(backend: Any) -> dict[str, Any]:
    """select with the two other choices methods: greedy token selection, and the mean of the
    conditional minus the unconditional logprobs (its extra /generate sends `input_ids` with
    return_logprob and no logprob_start_len)."""
    out: dict[str, Any] = {"choices": CAPITAL_CHOICES}
    methods = {"greedy_token_selection": sgl.greedy_token_selection,
               "unconditional_likelihood_normalized": sgl.unconditional_likelihood_normalized}
    for name, method in methods.items():
        state = select_program.run(method=method, temperature=0)
        err = state.error()
        meta = state.get_meta_info("capital") or {}
        out[name] = {"error": _error_text(err),
                     "capital": None if err else state["capital"],
                     "greedy_logprob_matrix": meta.get("greedy_logprob_matrix"),
                     "unconditional_token_logprobs": meta.get("unconditional_token_logprobs"),
                     "normalized_unconditional_prompt_logprobs":
                         meta.get("normalized_unconditional_prompt_logprobs")}
    return out


def section_stream(backend: Any) -> dict[str, Any]:
    question = "Name three things to do in Paris."
    plain = answer_program.run(question=question, temperature=0)
    _check(plain)
    streamed = answer_program.run(question=question, temperature=0, stream=True)
    chunks = list(streamed.text_iter())
    _check(streamed)
    return {
        "chunks": chunks,
        "joined": "".join(chunks),
        "streamed_text": streamed.text(),
        "streamed_answer": streamed["answer"],
        "plain_text": plain.text(),
        "plain_answer": plain["answer"],
    }


def section_batch(backend: Any) -> dict[str, Any]:
    states = batch_program.run_batch([{"question": q} for q in BATCH_QUESTIONS],
                                     temperature=0, num_threads=3, progress_bar=False)
    for state in states:
        _check(state)
    return {
        "questions": BATCH_QUESTIONS,
        "answers": [state["answer"] for state in states],
        "finish_reasons": [_finish(state.get_meta_info("answer")) for state in states],
    }


def _constrained(program: Callable[..., Any], name: str, pattern: Any) -> dict[str, Any]:
    state = program.run(temperature=0)
    _check(state)
    return {"output": state[name], "constraint": pattern,
            "finish_reason": _finish(state.get_meta_info(name))}


def section_regex_digits(backend: Any) -> dict[str, Any]:
    return _constrained(digits_program, "number", REGEX_DIGITS)


def section_regex_email(backend: Any) -> dict[str, Any]:
    return _constrained(email_program, "email", REGEX_EMAIL)


def section_json_schema(backend: Any) -> dict[str, Any]:
    return _constrained(json_program, "person", JSON_SCHEMA)


PARTS: dict[str, list[tuple[str, Callable[[Any], dict[str, Any]]]]] = {
    "unconstrained": [("endpoint", section_endpoint), ("chat_program", section_chat_program),
                      ("select_methods", section_select_methods),
                      ("stream", section_stream), ("batch", section_batch)],
    "constrained": [("regex_digits", section_regex_digits),
                    ("regex_email", section_regex_email), ("json_schema", section_json_schema)],
}


# ---------------------------------------------------------------- main


def _jsonable(value: Any) -> Any:
    """JSON-safe copy: NaN/inf floats become strings, unknown objects their repr."""
    if isinstance(value, float) and not math.isfinite(value):
        return repr(value)
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    return repr(value)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--part", choices=["unconstrained", "constrained", "all"], default="all")
    args = parser.parse_args(argv)

    result: dict[str, Any] = {"sglang_version": sgl.__version__, "url": args.url,
                              "sections": {}, "running": None}

    def save() -> None:
        with open(args.out, "w") as fh:
            json.dump(_jsonable(result), fh, indent=1)

    try:
        backend = sgl.RuntimeEndpoint(args.url, chat_template_name=CHAT_TEMPLATE)
        sgl.set_default_backend(backend)
    except Exception as exc:
        result["backend_error"] = _error_text(exc)
        save()
        return 1

    parts = ["unconstrained", "constrained"] if args.part == "all" else [args.part]
    for part in parts:
        for name, section in PARTS[part]:
            result["running"] = name
            save()
            start = time.monotonic()
            try:
                entry = {"ok": True, **section(backend)}
            except Exception as exc:
                entry = {"ok": False, "error": f"{type(exc).__name__}: {exc}",
                         "traceback": _error_text(exc)}
            entry["seconds"] = round(time.monotonic() - start, 2)
            result["sections"][name] = entry
    result["running"] = None
    save()
    return 0


if __name__ == "__main__":
    sys.exit(main())
