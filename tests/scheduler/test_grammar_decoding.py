"""Constrained decoding end to end in the scheduler (in-process) on the default model."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
import transformers

from tests.scheduler.harness import FakeIO, make, run_until_idle, submit

pytestmark = pytest.mark.slow

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 24},
        "age": {"type": "integer"},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 12}, "maxItems": 3},
    },
    "required": ["name", "age"],
}
EMAIL = r"[a-z]{3,10}@[a-z]{3,8}\.(com|org)"
DATE = r"\d{4}-\d{2}-\d{2}"
EBNF = 'root ::= "answer: " ("yes" | "no")'


@pytest.fixture(scope="module")
def tok(default_model_path: str):
    return transformers.AutoTokenizer.from_pretrained(default_model_path)


def _prompt(tok, text: str) -> list[int]:
    chat = tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True, tokenize=False)
    return tok(chat)["input_ids"]


@pytest.fixture(scope="module")
def plain(default_model_path: str) -> tuple[Any, FakeIO]:
    """The scheduler without overlap, shared by the tests that need no other setting: each
    scheduler starts its own grammar compile helper, which takes seconds. Every test leaves it
    idle (`run_until_idle` checks)."""
    return make(default_model_path, dtype="bfloat16")


@pytest.mark.parametrize("overlap", [False, True])
def test_constrained_outputs_parse_and_match(default_model_path: str, tok, plain, overlap: bool) -> None:
    sched, io = make(default_model_path, dtype="bfloat16", disable_overlap_schedule=False) if overlap else plain
    jobs = {
        "json": ("Describe a person as JSON.", {"json_schema": json.dumps(SCHEMA), "max_new_tokens": 160}),
        "digits": ("Pick a number.", {"regex": r"\d{3}", "max_new_tokens": 8}),
        "email": ("Write an e-mail address.", {"regex": EMAIL, "max_new_tokens": 24}),
        "date": ("When is it?", {"regex": DATE, "max_new_tokens": 16}),
        "ebnf": ("Is the sky blue?", {"ebnf": EBNF, "max_new_tokens": 8}),
        "free": ("Say hello.", {"max_new_tokens": 8}),
    }
    for rid, (text, params) in jobs.items():
        submit(io, rid, _prompt(tok, text), ignore_eos=False, **params)
    for i in range(3):  # sampled, several at once, like n=3
        submit(io, f"digits_s{i}", _prompt(tok, "Pick a number."), ignore_eos=False, regex=r"\d{3}",
               max_new_tokens=8, temperature=0.9, seed=i)
    results = run_until_idle(sched, io)
    text = {rid: tok.decode(r["ids"], skip_special_tokens=True) for rid, r in results.items()}
    assert all(r["finishes"] == 1 for r in results.values())
    assert results["json"]["finish"]["type"] == "stop", text["json"]
    parsed = json.loads(text["json"])
    assert {"name", "age"} <= parsed.keys() and isinstance(parsed["age"], int)
    for rid in ("digits", "digits_s0", "digits_s1", "digits_s2"):
        assert re.fullmatch(r"\d{3}", text[rid]), (rid, text[rid])
    assert re.fullmatch(EMAIL, text["email"]), text["email"]
    assert re.fullmatch(DATE, text["date"]), text["date"]
    assert re.fullmatch(r"answer: (yes|no)", text["ebnf"]), text["ebnf"]
    assert results["digits"]["finish"]["type"] == "stop"


def test_bad_grammar_fails_only_its_request(tok, plain) -> None:
    sched, io = plain
    submit(io, "bad", _prompt(tok, "x"), regex="[.*", max_new_tokens=4)
    submit(io, "good", _prompt(tok, "Say hi."), max_new_tokens=4)
    results = run_until_idle(sched, io)
    assert results["bad"]["finish"]["type"] == "abort" and "grammar" in results["bad"]["finish"]["message"]
    assert results["good"]["finish"]["type"] == "length"
