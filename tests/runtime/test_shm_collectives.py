"""The shared-memory collectives of CPU tensor parallelism, between this process (rank 0) and a
spawned rank 1: sums, gathers and broadcasts of many sizes and dtypes back to back (the two
buffers reused in turn), the same bits on both ranks, and a peer's death raising, not hanging."""

from __future__ import annotations

import multiprocessing as mp
import os

import pytest
import torch

from runtime import shm_collectives
from runtime.shm_collectives import ShmCollectives

pytestmark = pytest.mark.skipif(not shm_collectives.available(), reason="x86 with /dev/shm only")

CALLS = 300


def values(rank: int, call: int) -> torch.Tensor:
    """What rank `rank` contributes to call `call` (either rank can compute the other's)."""
    gen = torch.Generator().manual_seed(call)
    shape = (int(torch.randint(1, 40, (1,), generator=gen)), int(torch.randint(1, 600, (1,), generator=gen)))
    dtype = (torch.float32, torch.bfloat16, torch.int64)[call % 3]
    x = torch.randn(shape, generator=torch.Generator().manual_seed(call * 10 + rank)) * 4
    return x.to(dtype)


def run_calls(shm: ShmCollectives) -> list[torch.Tensor]:
    """Every call's result on this rank (the caller checks them)."""
    results = []
    for call in range(CALLS):
        x = values(shm.rank, call)
        kind = call % 4
        if kind in (0, 3):
            results.append(shm.all_reduce(x).clone())
        elif kind == 1:
            results.append(shm.all_gather(x).clone())
        else:
            results.append(shm.broadcast_(x).clone())
    return results


def expected(call: int) -> torch.Tensor:
    parts = [values(r, call) for r in range(2)]
    kind = call % 4
    if kind in (0, 3):
        return parts[0] + parts[1]
    return torch.stack(parts) if kind == 1 else parts[0]


def rank1_main(path: str, pids: list[int], out: mp.Queue) -> None:
    shm = ShmCollectives(path, 1, 2, [pids[0], os.getpid()])
    results = run_calls(shm)
    out.put([bool(torch.equal(r, expected(c))) for c, r in enumerate(results)])
    out.put([r.float().sum().item() for r in results])  # rank 0 compares these bits


def exit_at_once(path: str, pids: list[int], out: mp.Queue) -> None:
    ShmCollectives(path, 1, 2, [pids[0], os.getpid()])
    out.put("mapped")


def start_rank1(tmp_name: str, target) -> tuple[str, mp.Process, mp.Queue]:
    path = f"/dev/shm/radixserve-test-{os.getpid()}-{tmp_name}"
    ShmCollectives.create(path, 2)
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    proc = ctx.Process(target=target, args=(path, [os.getpid(), 0], out), daemon=True)
    proc.start()
    return path, proc, out


def test_results_are_exact_and_the_same_on_both_ranks() -> None:
    path, proc, out = start_rank1("exact", rank1_main)
    try:
        shm = ShmCollectives(path, 0, 2, [os.getpid(), proc.pid])
        results = run_calls(shm)
        assert all(torch.equal(r, expected(c)) for c, r in enumerate(results))
        assert all(out.get(timeout=60))
        assert out.get(timeout=60) == [r.float().sum().item() for r in results]
        shm.close()
    finally:
        os.unlink(path)
        proc.join(timeout=30)
    assert proc.exitcode == 0


def test_a_dead_peer_raises() -> None:
    path, proc, out = start_rank1("dead", exit_at_once)
    try:
        assert out.get(timeout=60) == "mapped"
        proc.join(timeout=30)
        shm = ShmCollectives(path, 0, 2, [os.getpid(), proc.pid])
        with pytest.raises(RuntimeError, match=f"pid {proc.pid}"):
            shm.all_reduce(torch.ones(4))
    finally:
        os.unlink(path)
