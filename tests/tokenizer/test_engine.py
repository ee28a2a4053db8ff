"""The whole runtime (three processes) through the in-process Engine, on the real default model.

Greedy outputs must equal Hugging Face's for every scheduling configuration; the memory
invariant must hold once the engine goes idle.

An engine costs seconds to start, so tests whose configurations do not conflict share one: the
engine without the radix cache matches HF and is then killed (the killed-scheduler test); the
tiny-pool engine (`TestTinyPool`) prefills in chunks of 32, so it serves both the chunked-prefill
HF check and the pool-pressure test. HF's answers are computed once per run
(tests/conftest.py).
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator

import pytest

from runtime import Engine
from runtime.contracts.errors import RuntimeCrashed
from tests import chat_reference
from tests.engine_checks import assert_idle_and_sound

pytestmark = pytest.mark.slow

NEW_TOKENS = 24
GREEDY = {"temperature": 0, "max_new_tokens": NEW_TOKENS}
TINY_POOL = 400  # KV tokens: a fraction of what the tiny-pool workload needs at once
CHUNK = 32  # prompt tokens per prefill chunk in the tiny-pool engine: every chat prompt is chunked


@pytest.fixture(scope="module")
def hf_reference(hf_greedy: chat_reference.HFGreedy, chat_ids: list[list[int]]) -> list[list[int]]:
    """HF's greedy answers cut to NEW_TOKENS (the run's shared reference is longer)."""
    assert chat_reference.HF_NEW_TOKENS >= NEW_TOKENS
    return [answer[:NEW_TOKENS] for answer in hf_greedy.first(len(chat_ids))]


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


def test_encode_embeds_like_the_http_route_and_shares_the_cache(engine: Engine) -> None:
    prefix = "A shared start that the radix cache keeps for the second input. " * 6
    (first,) = engine.encode([prefix + "One."])
    (second,) = engine.encode(prefix + "Two.")  # inputs sent together may share a prefill instead
    assert len(first["embedding"]) == 576 and abs(sum(v * v for v in first["embedding"]) - 1) < 1e-5
    assert second["meta_info"]["cached_tokens"] > 50
    (cut,) = engine.encode(prefix + "One.", dimensions=16)
    assert len(cut["embedding"]) == 16
    assert_idle_and_sound(engine)


def _ids(results: list[dict]) -> list[list[int]]:
    return [r["output_ids"] for r in results]


def _assert_matches_hf(results: list[list[int]], hf_reference: list[list[int]]) -> None:
    assert len(results) == len(hf_reference)
    for i, (got, expected) in enumerate(zip(results, hf_reference)):
        # HF stops at EOS; compare the part it produced.
        assert got[: len(expected)] == expected, chat_reference.QUESTIONS[i]


def test_greedy_alone_and_batched_match_hf(engine: Engine, chat_ids, hf_reference) -> None:
    alone = [engine.generate(input_ids=ids, sampling_params=GREEDY)["output_ids"] for ids in chat_ids]
    batched = _ids(engine.generate(input_ids=chat_ids * 2, sampling_params=GREEDY))  # 16 at a time
    _assert_matches_hf(alone, hf_reference)
    for i in range(len(chat_ids)):
        assert batched[i] == alone[i] and batched[i + len(chat_ids)] == alone[i]
    assert_idle_and_sound(engine)


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


class TestTinyPool:
    """One engine with a KV pool of TINY_POOL tokens that prefills in chunks of CHUNK (radix cache
    on), for two tests. Class-scoped, so it is gone before the engines of the later tests start.
    Each test leaves it idle and sound (which it asserts), so their order does not matter."""

    @pytest.fixture(scope="class")
    @classmethod
    def tiny_engine(cls) -> Iterator[Engine]:
        yield from _engine(max_total_tokens=TINY_POOL, chunked_prefill_size=CHUNK)

    def test_greedy_matches_hf_with_chunked_prefill(self, tiny_engine: Engine, chat_ids, hf_reference) -> None:
        """Middle chunks are published to the radix cache. The prompts go four at a time: four
        whole answers fit the pool, so no request is retracted (asserted) and the chunked
        prefill alone stands between these answers and HF's."""
        half = len(chat_ids) // 2
        assert all(len(ids) > CHUNK for ids in chat_ids)  # every prompt needs more than one chunk
        assert half * max(len(ids) + NEW_TOKENS for ids in chat_ids) <= TINY_POOL
        retractions = tiny_engine.get_state()["retractions"]
        results = []
        for part in (chat_ids[:half], chat_ids[half:]):
            results += _ids(tiny_engine.generate(input_ids=part, sampling_params=GREEDY))
        _assert_matches_hf(results, hf_reference)
        assert_idle_and_sound(tiny_engine)
        assert tiny_engine.get_state()["retractions"] == retractions

    def test_tiny_pool_still_finishes_everything(self, tiny_engine: Engine) -> None:
        params = {"temperature": 0, "max_new_tokens": 16, "ignore_eos": True}
        results = tiny_engine.generate(_mixed_prompts(24), params)
        assert all(r["meta_info"]["finish_reason"]["type"] == "length" for r in results)
        assert_idle_and_sound(tiny_engine)


def _wait_running(engine: Engine, count: int, timeout_s: float = 120.0) -> None:
    """Poll the scheduler's state until `count` requests run (the deadline only bounds a failure)."""
    deadline = time.monotonic() + timeout_s
    while (state := engine.get_state())["running"] < count:
        assert time.monotonic() < deadline, f"{count} requests not running after {timeout_s} s: {state}"
        time.sleep(0.02)


def test_greedy_matches_hf_without_radix_cache_then_a_killed_scheduler_fails_calls(chat_ids, hf_reference) -> None:
    """One engine for two checks (the kill ends it): without the radix cache the greedy answers
    are HF's; then SIGKILL to the scheduler fails the call in flight and every later call."""
    for doomed in _engine(disable_radix_cache=True):
        _assert_matches_hf(_ids(doomed.generate(input_ids=chat_ids, sampling_params=GREEDY)), hf_reference)
        assert_idle_and_sound(doomed)

        errors: list[BaseException] = []

        def call() -> None:
            try:
                doomed.generate("Count to one thousand:", {"max_new_tokens": 4000, "ignore_eos": True})  # noqa: B023
            except BaseException as exc:  # the test inspects it
                errors.append(exc)  # noqa: B023 (the thread is joined within this iteration)

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
        _assert_matches_hf(batched, hf_reference)
        alone = tp.generate(input_ids=chat_ids[0], sampling_params=GREEDY)["output_ids"]
        assert alone == batched[0]
        assert_idle_and_sound(tp)

        errors: list[BaseException] = []

        def call(i: int) -> None:
            try:
                tp.generate(f"Count to one thousand, {i}:", {"max_new_tokens": 4000, "ignore_eos": True})  # noqa: B023
            except BaseException as exc:  # the test inspects it
                errors.append(exc)  # noqa: B023 (the threads are joined within this iteration)

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
        # The runtime's watcher joins the children too: when it reaps rank 0 first, this join
        # returns (its waitpid fails) before the watcher has stored the exit code.
        deadline = time.monotonic() + 5
        while rank0.exitcode is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert rank0.exitcode not in (None, 0)
        with pytest.raises(RuntimeCrashed):
            tp.generate("hello", {"max_new_tokens": 2})
