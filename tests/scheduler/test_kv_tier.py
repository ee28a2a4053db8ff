"""The KV tier behind the radix cache: a prefix from the pool, from the tier or recomputed gives
the same greedy tokens; the store survives a restart and a corrupt block only costs a recompute.

Agent-like sessions (a shared system prompt, then turns that resend the whole history plus a
"tool result") run on the default model in fp32 over a pool that holds about two sessions, so
returning sessions find their history evicted from the pool."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from kernels.kv_store import FILE_NAME
from tests.scheduler.harness import make, run_until_idle, submit

pytestmark = pytest.mark.slow

SYSTEM = list(range(1000, 1100))  # a shared 100-token system prompt
SESSIONS, TURNS, NEW = 4, 3, 4
LAST = range(TURNS - 1, TURNS)  # the turn run after a restart
SMALL_POOL = 320  # tokens: the pool holds about two sessions' histories
TIER_GB = 0.25


def session_turns(sessions: int = SESSIONS, turns: int = TURNS) -> list[list[list[int]]]:
    """Each session's tool results, one per turn (its first turn's is its task)."""
    rng = random.Random(7)
    return [[[rng.randrange(200, 40000) for _ in range(rng.randrange(20, 50))] for _ in range(turns)]
            for _ in range(sessions)]


def run_sessions(sched: Any, io: Any, turns: range,
                 histories: dict[int, list[int]]) -> dict[tuple[int, int], list[int]]:
    """Run `turns` of every session, one turn of all sessions at a time; histories carry over."""
    results = {}
    steps = session_turns()
    for t in turns:
        for s in range(SESSIONS):
            histories.setdefault(s, list(SYSTEM))
            histories[s] += steps[s][t]
            submit(io, f"s{s}t{t}", histories[s], max_new_tokens=NEW)
        done = run_until_idle(sched, io)
        for s in range(SESSIONS):
            ids = done[f"s{s}t{t}"]["ids"]
            results[(s, t)] = ids
            histories[s] += ids
    return results


def on_store(model_path: str, folder: Path) -> tuple[Any, Any]:
    """A scheduler with the small pool and a persistent tier in `folder`."""
    return make(model_path, max_total_tokens=SMALL_POOL, kv_store=str(folder), kv_tier_gb=TIER_GB)


def turns_of(results: dict[tuple[int, int], list[int]], turns: range) -> dict[tuple[int, int], list[int]]:
    return {key: ids for key, ids in results.items() if key[1] in turns}


@pytest.fixture(scope="module")
def reference(default_model_path: str) -> dict[tuple[int, int], list[int]]:
    """Everything recomputed: no prefix cache at all."""
    sched, io = make(default_model_path, disable_radix_cache=True, max_total_tokens=8192)
    return run_sessions(sched, io, range(TURNS), {})


# Every pair of page size {1, 16}, chunk {none, 32} and overlap {off, on}.
@pytest.mark.parametrize(("page_size", "chunk", "overlap"),
                         [(1, None, False), (16, 32, False), (1, 32, True), (16, None, True)])
def test_tier_gives_the_tokens_of_recompute(default_model_path: str, reference: dict, page_size: int,
                                            chunk: int | None, overlap: bool) -> None:
    sched, io = make(default_model_path, max_total_tokens=SMALL_POOL, kv_tier_gb=TIER_GB, page_size=page_size,
                     chunked_prefill_size=chunk or -1, disable_overlap_schedule=not overlap, kv_block_size=32)
    try:
        assert run_sessions(sched, io, range(TURNS), {}) == reference
        state = sched.state()
        assert state["tier_loaded_tokens"] > 0 and state["evicted_tokens"] > 0, state
        sched.check_idle_integrity()
    finally:
        sched.close()


def test_tier_recompute_choice_gives_the_same_tokens(default_model_path: str, reference: dict,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    sched, io = make(default_model_path, max_total_tokens=SMALL_POOL, kv_tier_gb=TIER_GB)
    try:
        assert sched.ledger.tier is not None
        monkeypatch.setattr(sched.ledger.tier.costs, "prefer_load", lambda tokens: False)
        assert run_sessions(sched, io, range(TURNS), {}) == reference
        assert sched.state()["tier_loaded_tokens"] == 0 and sched.state()["tier_hit_tokens"] > 0
    finally:
        sched.close()


def test_store_serves_a_restarted_scheduler(default_model_path: str, reference: dict, tmp_path: Path) -> None:
    histories: dict[int, list[int]] = {}
    first, io = on_store(default_model_path, tmp_path)
    try:
        assert run_sessions(first, io, range(TURNS - 1), histories) == turns_of(reference, range(TURNS - 1))
    finally:
        first.close()
    second, io = on_store(default_model_path, tmp_path)
    try:
        state = second.state()
        assert state["tier_restored_blocks"] > 0, state
        assert run_sessions(second, io, LAST, histories) == turns_of(reference, LAST)
        state = second.state()
        assert state["tier_loads"] >= SESSIONS and state["tier_corrupt_blocks"] == 0, state
    finally:
        second.close()


def test_corrupt_blocks_are_recomputed(default_model_path: str, reference: dict, tmp_path: Path) -> None:
    histories: dict[int, list[int]] = {}
    first, io = on_store(default_model_path, tmp_path)
    try:
        run_sessions(first, io, range(TURNS - 1), histories)
        block_bytes, slot_bytes = first.ledger.tier.store.layout.data_bytes, first.ledger.tier.store.layout.slot_bytes
    finally:
        first.close()
    path = tmp_path / FILE_NAME
    with open(path, "r+b") as fh:  # a flipped byte in every third slot's data
        for slot in range(0, (path.stat().st_size - 4096) // slot_bytes, 3):
            fh.seek(4096 + slot * slot_bytes + 4096 + block_bytes // 2)
            byte = fh.read(1)[0]
            fh.seek(-1, 1)
            fh.write(bytes([byte ^ 0xFF]))
    second, io = on_store(default_model_path, tmp_path)
    try:
        assert run_sessions(second, io, LAST, histories) == turns_of(reference, LAST)
        assert second.state()["tier_corrupt_blocks"] > 0
        second.check_idle_integrity()
    finally:
        second.close()


def test_flush_empties_the_store(default_model_path: str, tmp_path: Path) -> None:
    from runtime.contracts.messages import FlushCacheReq

    sched, io = on_store(default_model_path, tmp_path)
    try:
        run_sessions(sched, io, range(1), {})
        assert sched.state()["tier_blocks"] > 0
        sched.dispatch(FlushCacheReq(1))
        assert io.control[-1].success and sched.state()["tier_blocks"] == 0
    finally:
        sched.close()
    again, io = on_store(default_model_path, tmp_path)
    try:
        assert again.state()["tier_restored_blocks"] == 0
    finally:
        again.close()


CRASHING_RUN = """
import sys
from runtime.support.default_model import ensure_default_model
from pathlib import Path
from tests.scheduler import test_kv_tier as T
sched, io = T.on_store(ensure_default_model(), Path(sys.argv[1]))
T.run_sessions(sched, io, range(T.TURNS - 1), {})
print("written", flush=True)
histories = {}
while True:  # more sessions' turns, so that the store is being written when the kill comes
    T.run_sessions(sched, io, range(T.TURNS), histories)
"""


def test_sigkill_while_writing_then_restart(default_model_path: str, reference: dict, tmp_path: Path) -> None:
    """kill -9 the scheduler's process while its writer fills the store; a new one on that store
    is consistent and answers the last turn with the reference's tokens."""
    root = Path(__file__).resolve().parents[2]
    proc = subprocess.Popen([sys.executable, "-c", CRASHING_RUN, str(tmp_path)], cwd=root, stdout=subprocess.PIPE,
                            env={**os.environ, "PYTHONPATH": str(root)})
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == b"written"
        time.sleep(0.3)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    steps = session_turns()
    histories = {s: SYSTEM + [t for turn in range(TURNS - 1) for t in steps[s][turn] + reference[(s, turn)]]
                 for s in range(SESSIONS)}
    sched, io = on_store(default_model_path, tmp_path)
    try:
        sched.check_integrity()
        assert sched.state()["tier_restored_blocks"] > 0
        assert run_sessions(sched, io, LAST, histories) == turns_of(reference, LAST)
        assert sched.state()["tier_loads"] > 0
        sched.check_idle_integrity()
    finally:
        sched.close()
