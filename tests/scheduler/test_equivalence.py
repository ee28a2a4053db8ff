"""Scheduling never changes a greedy token: the default model in fp32 under every combination of
overlap on/off, radix cache on/off, chunked prefill 32/none and page size 1/16 (with mixed
prefill+decode batches, the CPU default, and a few without), plus pools small enough to force
eviction and retraction. The memory invariant holds after each run, idle.

By default the configuration test runs `PAIRWISE`, six rows of `GRID` that hold every pair of
option values the whole grid holds (and the all-on row, and all three chunked rows without mixed
batches); `RADIXSERVE_FULL_TESTS=1` runs every row of `GRID`."""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable
from typing import Any

import pytest

from tests import FULL_TESTS
from tests.scheduler.harness import make, run_until_idle, submit

pytestmark = pytest.mark.slow

SYSTEM = list(range(1000, 1090))  # a shared 90-token "system prompt"


def prompts() -> list[tuple[list[int], dict]]:
    rng = random.Random(3)
    out = []
    for i in range(10):
        own = [rng.randrange(200, 40000) for _ in range(rng.randrange(3, 70))]
        prompt = SYSTEM + own if i % 3 else own
        params: dict = {"max_new_tokens": 12}
        if i % 4 == 1:
            params["stop"] = [".", " the"]  # stop strings end some requests early
        out.append((prompt, params))
    return out


def long_outputs() -> list[tuple[list[int], dict]]:
    """Requests that all grow at once: with optimistic reservations the pool must retract."""
    rng = random.Random(5)
    return [([rng.randrange(200, 40000) for _ in range(rng.randrange(12, 40))], {"max_new_tokens": 64})
            for _ in range(8)]


Workload = Callable[[], list[tuple[list[int], dict]]]


def outputs(sched: Any, io: Any, workload: Workload) -> dict:
    """`workload()`'s requests submitted and run until idle: rid -> (output ids, finish)."""
    for i, (prompt, params) in enumerate(workload()):
        submit(io, f"e{i}", prompt, ignore_eos=False, **params)
    return {rid: (r["ids"], r["finish"]) for rid, r in run_until_idle(sched, io).items()}


def run(default_model_path: str, workload: Workload = prompts, optimistic: bool = False,
        **overrides: Any) -> tuple[dict, Any]:
    sched, io = make(default_model_path, max_total_tokens=overrides.pop("max_total_tokens", 8192), **overrides)
    if optimistic:  # reserve nothing for decode growth, as after a long quiet decay
        sched.ratio.value = 0.0
    return outputs(sched, io, workload), sched


@pytest.fixture(scope="module")
def baseline(default_model_path: str) -> dict:
    overlap, radix, chunk, page, mixed = BASELINE
    return run(default_model_path, disable_overlap_schedule=not overlap, disable_radix_cache=not radix,
               chunked_prefill_size=chunk, page_size=page, enable_mixed_chunk=mixed)[0]


BASELINE = (False, False, -1, 1, False)  # overlap off, radix off, no chunking, page 1, not mixed
Config = tuple[bool, bool, int, int, bool]  # overlap, radix, chunk, page, mixed
# Every combination with mixed batches, and the chunked ones without: never the baseline itself.
GRID: list[Config] = [(*c, True) for c in itertools.product([False, True], [False, True], [32, -1], [1, 16])]
GRID += [(True, True, 32, 1, False), (False, True, 32, 16, False), (True, False, 32, 16, False)]
# A smallest subset of GRID (6 rows; a search finds no 5-row one) that has the all-on row and
# holds every pair of option values GRID holds (test_pairwise_rows_cover_every_pair_of_the_grid):
# a scheduling bug that needs two options set a certain way still meets one of these rows.
PAIRWISE: list[Config] = [
    (True, True, 32, 16, True),  # all on
    (False, False, -1, 1, True),  # the baseline but mixed
    (True, True, -1, 16, True),
    (True, True, 32, 1, False),
    (False, True, 32, 16, False),
    (True, False, 32, 16, False),
]
CONFIGS = GRID if FULL_TESTS else PAIRWISE


def option_pairs(rows: list[Config]) -> set[tuple[int, object, int, object]]:
    return {(i, row[i], j, row[j]) for row in rows for i in range(5) for j in range(i + 1, 5)}


def test_pairwise_rows_cover_every_pair_of_the_grid() -> None:
    assert set(PAIRWISE) <= set(GRID) and option_pairs(PAIRWISE) == option_pairs(GRID)


@pytest.mark.parametrize("overlap,radix,chunk,page,mixed", CONFIGS,
                         ids=[f"ov{o}-rx{r}-ch{c}-pg{p}-mx{m}" for o, r, c, p, m in CONFIGS])
def test_same_tokens_every_configuration(default_model_path, baseline, overlap, radix, chunk, page, mixed) -> None:
    results, sched = run(default_model_path, disable_overlap_schedule=not overlap, disable_radix_cache=not radix,
                         chunked_prefill_size=chunk, page_size=page, enable_mixed_chunk=mixed, dtype="float32")
    assert results == baseline
    if mixed and chunk > 0:  # chunked prompts keep others decoding: some forwards were mixed
        assert sched.batcher.mixed_steps > 0
    assert any(finish["type"] == "stop" and isinstance(finish["matched"], str) for _, finish in results.values())


@pytest.fixture(scope="module")
def long_expected(default_model_path: str) -> dict:
    """`long_outputs` in a pool large enough for all of them at once: no retraction."""
    return run(default_model_path, long_outputs, disable_overlap_schedule=True)[0]


# Overlap off and on, pages of 1 and 16: the two rows hold each value; the full run adds the
# third combination (the fake-runner grid in test_scheduler_parts.py covers all four in ms).
EVICTION_GRID = [(False, 1), (True, 16)] + ([(True, 1)] if FULL_TESTS else [])


@pytest.mark.parametrize("overlap,page", EVICTION_GRID)
def test_same_tokens_with_eviction_and_retraction(default_model_path, long_expected, overlap, page) -> None:
    results, sched = run(default_model_path, long_outputs, disable_overlap_schedule=not overlap,
                         chunked_prefill_size=32, page_size=page, max_total_tokens=480, optimistic=True)
    assert results == long_expected
    assert sched.retractor.retractions > 0
    assert sched.ledger.cache.evicted_tokens > 0  # the pool was small enough to evict cached prefixes
    assert sched.batcher.mixed_steps > 0  # re-admitted requests prefilled beside running decodes


TP_GRID = [(False, True, 32, 1, True), (True, False, -1, 16, False)]


@pytest.mark.parametrize("overlap,radix,chunk,page,mixed", TP_GRID,
                         ids=[f"tp2-ov{o}-rx{r}-ch{c}-pg{p}-mx{m}" for o, r, c, p, m in TP_GRID])
def test_same_tokens_with_two_tensor_parallel_ranks(default_model_path, baseline, overlap, radix, chunk, page,
                                                    mixed) -> None:
    """Rank 0's scheduler in this process leading a real rank-1 process (gloo, a thread each)."""
    from runtime.contracts.config import ServerConfig
    from runtime.execution.resolve import resolve_config

    config = resolve_config(ServerConfig(
        model_path=default_model_path, device="cpu", dtype="float32", tp_size=2, max_total_tokens=8192,
        max_running_requests=16, disable_overlap_schedule=not overlap, disable_radix_cache=not radix,
        chunked_prefill_size=chunk, page_size=page, enable_mixed_chunk=mixed))
    assert run_two_ranks(config, prompts) == baseline


def run_two_ranks(config: Any, workload: Workload) -> dict:
    """`workload()`'s requests through a rank-0 scheduler in this process leading a real rank-1
    process (`config` resolved, tp_size 2): rid -> (output ids, finish), as `run` gives them."""
    from tests.runtime.parallel.tp_harness import tp_scheduler
    from tests.scheduler.harness import FakeIO

    io = FakeIO()
    with tp_scheduler(config, io) as sched:
        return outputs(sched, io, workload)


def repetitive() -> list[tuple[list[int], dict]]:
    """Agent-like: each prompt holds a block of 'code' twice, so n-gram drafts are often right."""
    rng = random.Random(9)
    out = []
    for _ in range(6):
        block = [rng.randrange(200, 40000) for _ in range(30)]
        out.append((SYSTEM[:20] + block + [13, 13] + block[:10], {"max_new_tokens": 24}))
    return out


SPEC_GRID = [(True, 32, 1), (False, -1, 16)]


@pytest.fixture(scope="module")
def repetitive_baseline(default_model_path: str) -> dict:
    return run(default_model_path, repetitive, disable_overlap_schedule=True, dtype="float32")[0]


@pytest.mark.parametrize("radix,chunk,page", SPEC_GRID, ids=[f"spec-rx{r}-ch{c}-pg{p}" for r, c, p in SPEC_GRID])
@pytest.mark.parametrize("workload", [prompts, repetitive], ids=["random", "repetitive"])
def test_same_tokens_with_ngram_speculation(default_model_path, baseline, repetitive_baseline, radix, chunk, page,
                                            workload) -> None:
    results, sched = run(default_model_path, workload, disable_radix_cache=not radix, chunked_prefill_size=chunk,
                         page_size=page, speculative_algorithm="ngram", speculative_disable_by_batch_size=64)
    assert results == (baseline if workload is prompts else repetitive_baseline)
    assert sched.speculator.steps > 0
    if workload is repetitive:
        assert sched.speculator.accepted > 0


def test_same_tokens_with_speculation_under_retraction(default_model_path, long_expected) -> None:
    results, sched = run(default_model_path, long_outputs, chunked_prefill_size=32, max_total_tokens=320,
                         optimistic=True, speculative_algorithm="ngram", speculative_num_draft_tokens=6,
                         speculative_disable_by_batch_size=64)
    assert results == long_expected and sched.retractor.retractions > 0 and sched.speculator.accepted > 0
