"""The whole runtime (three processes) through the in-process Engine, on the real default model.

Greedy outputs must equal Hugging Face's for every scheduling configuration; the memory
invariant must hold once the engine goes idle.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator

import pytest
import torch
import transformers

from runtime import Engine
from runtime.errors import RuntimeCrashed
from tests.engine_checks import assert_idle_and_sound

pytestmark = pytest.mark.slow

QUESTIONS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "List three prime numbers.",
    "Explain what a radix tree is in one sentence.",
    "What is 2 + 2?",
    "Name a famous painter.",
    "Translate 'good morning' into Spanish.",
    "Give me a synonym for happy.",
]
NEW_TOKENS = 24
GREEDY = {"temperature": 0, "max_new_tokens": NEW_TOKENS}


@pytest.fixture(scope="module")
def chat_ids(default_model_path: str) -> list[list[int]]:
    tok = transformers.AutoTokenizer.from_pretrained(default_model_path)
    texts = [
        tok.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True, tokenize=False)
        for q in QUESTIONS
    ]
    return [tok(t)["input_ids"] for t in texts]


@pytest.fixture(scope="module")
def hf_reference(default_model_path: str, chat_ids: list[list[int]]) -> list[list[int]]:
    hf = transformers.AutoModelForCausalLM.from_pretrained(default_model_path, dtype=torch.float32).eval()
    outs = []
    with torch.no_grad():
        for ids in chat_ids:
            out = hf.generate(torch.tensor([ids]), max_new_tokens=NEW_TOKENS, do_sample=False, pad_token_id=2)
            outs.append(out[0, len(ids) :].tolist())
    return outs


def _engine(**overrides: object) -> Iterator[Engine]:
    config = {"dtype": "float32", "max_total_tokens": 16384, "max_running_requests": 64, **overrides}
    engine = Engine(**config)
    try:
        yield engine
    finally:
        engine.shutdown()


@pytest.fixture(scope="module")
def engine() -> Iterator[Engine]:
    yield from _engine()


def _ids(results: list[dict]) -> list[list[int]]:
    return [r["output_ids"] for r in results]


def test_greedy_alone_and_batched_match_hf(engine: Engine, chat_ids, hf_reference) -> None:
    alone = [engine.generate(input_ids=ids, sampling_params=GREEDY)["output_ids"] for ids in chat_ids]
    batched = _ids(engine.generate(input_ids=chat_ids * 2, sampling_params=GREEDY))  # 16 at a time
    for i, expected in enumerate(hf_reference):
        assert alone[i][: len(expected)] == expected, QUESTIONS[i]
        assert batched[i] == alone[i] and batched[i + len(chat_ids)] == alone[i]
    assert_idle_and_sound(engine)


@pytest.mark.parametrize("overrides", [{"disable_radix_cache": True}, {"chunked_prefill_size": 32}])
def test_greedy_matches_hf_under_other_configs(overrides, chat_ids, hf_reference) -> None:
    for other in _engine(**overrides):
        results = _ids(other.generate(input_ids=chat_ids, sampling_params=GREEDY))
        for got, expected in zip(results, hf_reference):
            assert got[: len(expected)] == expected
        assert_idle_and_sound(other)


def test_repeated_and_shared_prefix_hit_the_cache(engine: Engine) -> None:
    engine.flush_cache()
    system = "You are a meticulous assistant who answers in full sentences. " * 8
    first = engine.generate(system + "What is the tallest mountain?", GREEDY)
    second = engine.generate(system + "What is the tallest mountain?", GREEDY)
    assert first["meta_info"]["cached_tokens"] == 0
    assert second["meta_info"]["cached_tokens"] > 0 and second["output_ids"] == first["output_ids"]
    other = engine.generate(system + "What is the longest river?", GREEDY)
    assert other["meta_info"]["cached_tokens"] >= len(engine.tokenizer_manager.tokenizer(system)["input_ids"]) - 1
    assert_idle_and_sound(engine)


def _mixed_prompts(n: int) -> list[str]:
    words = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu".split()
    return [" ".join(words[(i + j) % len(words)] for j in range(3 + (i * 7) % 60)) for i in range(n)]


def test_64_concurrent_requests_finish(engine: Engine) -> None:
    params = [{"temperature": 0, "max_new_tokens": 4 + i % 13, "ignore_eos": True} for i in range(64)]
    results = engine.generate(_mixed_prompts(64), params)
    assert [r["meta_info"]["completion_tokens"] for r in results] == [p["max_new_tokens"] for p in params]
    assert_idle_and_sound(engine)


def test_tiny_pool_still_finishes_everything(chat_ids) -> None:
    for small in _engine(max_total_tokens=400, chunked_prefill_size=64):
        params = {"temperature": 0, "max_new_tokens": 16, "ignore_eos": True}
        results = small.generate(_mixed_prompts(24), params)
        assert all(r["meta_info"]["finish_reason"]["type"] == "length" for r in results)
        assert_idle_and_sound(small)


def _wait_running(engine: Engine, count: int, timeout_s: float = 120.0) -> None:
    """Poll the scheduler's state until `count` requests run (the deadline only bounds a failure)."""
    deadline = time.monotonic() + timeout_s
    while (state := engine.get_state())["running"] < count:
        assert time.monotonic() < deadline, f"{count} requests not running after {timeout_s} s: {state}"
        time.sleep(0.02)


def test_killed_scheduler_fails_pending_calls() -> None:
    for doomed in _engine():
        errors: list[BaseException] = []

        def call() -> None:
            try:
                doomed.generate("Count to one thousand:", {"max_new_tokens": 4000, "ignore_eos": True})
            except BaseException as exc:  # noqa: BLE001 - the test inspects it
                errors.append(exc)

        worker = threading.Thread(target=call)
        worker.start()
        _wait_running(doomed, 1)
        scheduler = doomed._runtime.processes["scheduler"]
        os.kill(scheduler.pid, signal.SIGKILL)
        worker.join(timeout=10)
        assert not worker.is_alive(), "generate did not return after the scheduler died"
        assert errors and isinstance(errors[0], RuntimeCrashed)
        with pytest.raises(RuntimeCrashed):
            doomed.generate("hello", {"max_new_tokens": 2})


def test_two_tensor_parallel_ranks_match_hf_then_die_together(chat_ids, hf_reference) -> None:
    """tp_size 2 (gloo, a thread per rank): the same greedy answers, alone and batched; then
    killing rank 1 fails the calls in flight, rank 0 exits on its own, and later calls fail."""
    for tp in _engine(tp_size=2):
        assert tp._runtime.processes.keys() == {"scheduler", "detokenizer", "tp-rank-1"}
        batched = _ids(tp.generate(input_ids=chat_ids, sampling_params=GREEDY))
        for got, expected in zip(batched, hf_reference):
            assert got[: len(expected)] == expected
        alone = tp.generate(input_ids=chat_ids[0], sampling_params=GREEDY)["output_ids"]
        assert alone == batched[0]
        assert_idle_and_sound(tp)

        errors: list[BaseException] = []

        def call(i: int) -> None:
            try:
                tp.generate(f"Count to one thousand, {i}:", {"max_new_tokens": 4000, "ignore_eos": True})
            except BaseException as exc:  # noqa: BLE001 - the test inspects it
                errors.append(exc)

        workers = [threading.Thread(target=call, args=(i,)) for i in range(3)]
        for w in workers:
            w.start()
        _wait_running(tp, 3)
        os.kill(tp._runtime.processes["tp-rank-1"].pid, signal.SIGKILL)
        for w in workers:
            w.join(timeout=10)
            assert not w.is_alive(), "generate did not return after a rank died"
        assert len(errors) == 3 and all(isinstance(e, RuntimeCrashed) for e in errors), errors
        rank0 = tp._runtime.processes["scheduler"]
        rank0.join(timeout=30)  # its next collective fails: the rank does not outlive its peer
        assert rank0.exitcode not in (None, 0)
        with pytest.raises(RuntimeCrashed):
            tp.generate("hello", {"max_new_tokens": 2})
