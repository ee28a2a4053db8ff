"""The equivalence grid on the configuration users get by default: the shipped Q4_1 file's blocks,
run by our C++ kernels, with the decode stack (each decoder layer of a decode step in one C++
call), in the CPU's own dtype (`--dtype auto`). Greedy tokens must not depend on overlap, the radix
cache, chunking, page size or mixed batches (tests/scheduler/test_equivalence.py's PAIRWISE rows),
nor on whether decode rows share a cached prefix (the cascade, which sums in another order, is
only taken with --enable-batch-variance).

The CPU's own dtype is bf16 where it computes bf16 natively and fp32 elsewhere (AVX2-only CPUs);
the fp32 case runs here on every CPU too, so the grid holds for both kinds' defaults."""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from kernels.decode_attention import CASCADE_MIN, DecodeAttention
from runtime.models.decode_stack import DecodeStack
from runtime.support.default_model import gguf_path
from tests.scheduler.harness import make, run_until_idle, submit
from tests.scheduler.test_equivalence import BASELINE, PAIRWISE, SYSTEM, Config, prompts, run

pytestmark = pytest.mark.slow

# The two ways the default is served: `--dtype auto` (bf16 or fp32 by CPU), and the file's blocks
# in fp32 as an AVX2-only CPU's auto gives them.
DEFAULTS: dict[str, dict[str, Any]] = {
    "auto": {"dtype": "auto"},
    "fp32-blocks": {"dtype": "float32", "load_format": "gguf"},
}
# The CPU's own dtype on every PAIRWISE row; the AVX2 kind's fp32 on the all-on row (the fp32
# folder's grid in test_equivalence.py covers the rest of fp32's arithmetic).
ROWS = [("auto", row) for row in PAIRWISE] + [("fp32-blocks", PAIRWISE[0])]


def served(name: str) -> dict[str, Any]:
    """`run` arguments for default configuration `name` (model_path is run's first argument)."""
    if name == "auto":
        return {"model_path": None, **DEFAULTS[name]}
    return {"model_path": str(gguf_path()), **DEFAULTS[name]}


def options(row: Config) -> dict[str, Any]:
    overlap, radix, chunk, page, mixed = row
    return dict(disable_overlap_schedule=not overlap, disable_radix_cache=not radix, chunked_prefill_size=chunk,
                page_size=page, enable_mixed_chunk=mixed)


def shared_prefix() -> tuple[list[int], list[tuple[list[int], dict]]]:
    """A long system prompt, and enough requests on it that their decode steps take the cascade."""
    rows, shared = CASCADE_MIN["kernel"]
    rng = random.Random(11)
    system = SYSTEM + [rng.randrange(200, 40000) for _ in range(shared + 8 - len(SYSTEM))]
    return system, [(system + [rng.randrange(200, 40000) for _ in range(rng.randrange(2, 9))], {"max_new_tokens": 8})
                    for _ in range(rows)]


def run_on_warm_prefix(name: str, row: Config, **extra: Any) -> dict:
    """`shared_prefix`'s requests, sent once a first request has put the system prompt in the
    cache (sent together, each would prefill its own copy of it: nothing to share)."""
    system, requests = shared_prefix()
    kwargs = served(name)
    sched, io = make(kwargs.pop("model_path"), max_total_tokens=16384, max_running_requests=16, **kwargs,
                     **options(row), **extra)
    submit(io, "warm", system, max_new_tokens=1)
    run_until_idle(sched, io)
    for i, (prompt, params) in enumerate(requests):
        submit(io, f"s{i}", prompt, **params)
    return {rid: (r["ids"], r["finish"]) for rid, r in run_until_idle(sched, io).items()}


@dataclass
class Seen:
    """What the decode steps of a run took."""

    stacked: int = 0  # steps the C++ decode stack ran
    cascaded: int = 0  # decode plans that cascaded a shared prefix


@pytest.fixture
def seen(monkeypatch: pytest.MonkeyPatch) -> Iterator[Seen]:
    counts = Seen()
    plan, stack_run = DecodeAttention.plan, DecodeStack.run

    def plan_spy(self: DecodeAttention, *args: Any, **kwargs: Any) -> None:
        plan(self, *args, **kwargs)
        counts.cascaded += self.shared_index is not None

    def run_spy(self: DecodeStack, *args: Any, **kwargs: Any) -> Any:
        out = stack_run(self, *args, **kwargs)
        counts.stacked += out is not None
        return out

    monkeypatch.setattr(DecodeAttention, "plan", plan_spy)
    monkeypatch.setattr(DecodeStack, "run", run_spy)
    yield counts


def default_run(name: str, row: Config, workload=prompts) -> tuple[dict, Any]:
    kwargs = served(name)
    return run(kwargs.pop("model_path"), workload, max_running_requests=16, **kwargs, **options(row))


@pytest.fixture(scope="module")
def baselines() -> dict[tuple[str, str], dict]:
    return {}


def baseline(baselines: dict, name: str, workload) -> dict:
    key = (name, workload.__name__)
    if key not in baselines:
        baselines[key] = (run_on_warm_prefix(name, BASELINE) if workload is shared_prefix
                          else default_run(name, BASELINE, workload)[0])
    return baselines[key]


@pytest.mark.parametrize("name,row", ROWS, ids=[f"{n}-" + "-".join(map(str, r)) for n, r in ROWS])
def test_default_configuration_same_tokens(baselines, seen: Seen, name: str, row: Config) -> None:
    want = baseline(baselines, name, prompts)
    seen.stacked = 0
    assert default_run(name, row)[0] == want
    assert seen.stacked > 0, "the C++ decode stack served no decode step"


def test_rows_on_a_shared_prefix_attend_alone(baselines, seen: Seen) -> None:
    """Sixteen decode rows over one cached 512-token prefix: by default each attends to it alone,
    as without the cache, so the tokens are the cache-less baseline's (in the CPU's own dtype:
    whether the cascade runs does not depend on it)."""
    want = baseline(baselines, "auto", shared_prefix)
    seen.cascaded = seen.stacked = 0
    row = PAIRWISE[2]  # overlap, radix cache, pages and mixed batches on; unchunked: all decode at once
    assert row[1] and row[2] == -1
    assert run_on_warm_prefix("auto", row) == want
    assert seen.cascaded == 0 and seen.stacked > 0, seen


def test_batch_variance_takes_the_cascade(seen: Seen) -> None:
    """--enable-batch-variance: the same rows attend to the shared prefix once (their tokens may
    then differ from the baseline's: the cascade sums in another order)."""
    results = run_on_warm_prefix("auto", PAIRWISE[2], enable_batch_variance=True)
    assert seen.cascaded > 0 and seen.stacked > 0, seen
    assert all(finish["type"] == "length" for _, finish in results.values())
