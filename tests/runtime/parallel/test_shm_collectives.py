"""The shared-memory collectives of CPU tensor parallelism, between this process (rank 0) and a
spawned rank 1: sums, gathers and broadcasts of many sizes and dtypes back to back (the two
buffers reused in turn), the same bits on both ranks, and a peer's death raising, not hanging.
The mapping's file: ours and mode 0600 while mapped; a file or symlink planted at its path, or a
file of the wrong size, mode, owner or type, is refused."""

from __future__ import annotations

import hashlib
import multiprocessing as mp
import os
import stat

import pytest
import torch

from runtime.parallel import shm_collectives
from runtime.parallel.shm_collectives import ShmCollectives

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


def digest(t: torch.Tensor) -> str:
    """The tensor's bytes, hashed: equal only for the same bits (a sum would also depend on how many
    threads each process's torch reduces with, which an earlier test may have changed)."""
    return hashlib.sha256(t.contiguous().view(torch.uint8).numpy().tobytes()).hexdigest()


def rank1_main(path: str, pids: list[int], out: mp.Queue) -> None:
    shm = ShmCollectives(path, 1, 2, [pids[0], os.getpid()])
    results = run_calls(shm)
    out.put([bool(torch.equal(r, expected(c))) for c, r in enumerate(results)])
    out.put([digest(r) for r in results])  # rank 0 compares these bits


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
        assert out.get(timeout=60) == [digest(r) for r in results]
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


# ---------------------------------------------------------------- the file's privacy


@pytest.fixture
def shm_path() -> str:
    path = f"/dev/shm/radixserve-test-{os.getpid()}-private"
    yield path
    if os.path.lexists(path):
        os.unlink(path)


def test_the_file_is_ours_and_mode_0600_while_mapped(shm_path: str) -> None:
    old_umask = os.umask(0)  # a permissive umask must not widen it
    try:
        ShmCollectives.create(shm_path, 2)
    finally:
        os.umask(old_umask)
    shm = ShmCollectives(shm_path, 0, 2, [os.getpid(), os.getpid()])
    st = os.lstat(shm_path)
    assert stat.S_ISREG(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o600 and st.st_uid == os.getuid()
    assert st.st_size == shm_collectives.mapping_size(2)
    shm.close()


def test_new_paths_are_unguessable() -> None:
    a, b = shm_collectives.new_path(), shm_collectives.new_path()
    assert a != b and a.startswith("/dev/shm/radixserve-tp-") and len(os.path.basename(a)) >= 45


def test_a_planted_file_is_refused_not_used(shm_path: str) -> None:
    with open(shm_path, "wb") as fh:
        fh.write(b"planted")
    os.chmod(shm_path, 0o666)
    with pytest.raises(RuntimeError, match="already exists"):
        ShmCollectives.create(shm_path, 2)
    with open(shm_path, "rb") as fh:
        assert fh.read() == b"planted"


@pytest.mark.parametrize("dangling", [False, True])
def test_a_planted_symlink_is_refused_not_followed(shm_path: str, tmp_path, dangling: bool) -> None:
    target = tmp_path / "target"
    if not dangling:
        target.write_bytes(b"victim")
    os.symlink(target, shm_path)
    with pytest.raises(RuntimeError, match="already exists"):
        ShmCollectives.create(shm_path, 2)
    assert target.exists() != dangling
    if not dangling:
        assert target.read_bytes() == b"victim"


def _wrong_size(path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    ShmCollectives.create(path, 2)
    os.truncate(path, shm_collectives.mapping_size(2) - 64)


def _readable_by_others(path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    ShmCollectives.create(path, 2)
    os.chmod(path, 0o644)


def _someone_elses(path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    ShmCollectives.create(path, 2)
    uid = os.getuid()
    monkeypatch.setattr(os, "getuid", lambda: uid + 1)  # as if another user had made it


def _symlink_to_a_good_file(path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    real = path + "-real"
    ShmCollectives.create(real, 2)
    os.symlink(real, path)


def _a_fifo(path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    os.mkfifo(path, 0o600)


@pytest.mark.parametrize("plant, why", [
    (_wrong_size, "bytes, expected"),
    (_readable_by_others, "mode 0644"),
    (_someone_elses, "owned by uid"),
    (_symlink_to_a_good_file, "cannot open"),
    (_a_fifo, "not a regular file"),
], ids=lambda p: getattr(p, "__name__", ""))
def test_the_opener_refuses_anything_but_our_private_file(shm_path: str, monkeypatch: pytest.MonkeyPatch,
                                                          plant, why: str) -> None:
    try:
        plant(shm_path, monkeypatch)
        with pytest.raises(RuntimeError, match=why):
            ShmCollectives(shm_path, 1, 2, [os.getpid(), os.getpid()])
    finally:
        if os.path.lexists(shm_path + "-real"):
            os.unlink(shm_path + "-real")
