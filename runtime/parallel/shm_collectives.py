"""All-reduce, all-gather and broadcast between CPU ranks on one machine, through shared memory.

Gloo's collectives cost about 0.3-1 ms each on the 2-core machines (TCP on loopback, a thread
hand-off per call); a decode step of a 30-layer model makes 62 of them, which made tp_size 2
six times slower than one rank. Here each rank copies its tensor into its own slot of one shared
mapping, publishes a sequence number, waits (spinning) until every rank has published it, and
reads the others' slots: a few microseconds plus the copies. SGLang's and vLLM's CPU backends
do the same with C++ kernels; this one is torch and numpy on an mmap.

Layout of the mapping (a file in /dev/shm, unlinked as soon as every rank has mapped it, so a
crash cannot leave it behind): one int64 control word per rank, then for each of 2 buffers
(alternating by sequence parity) one data slot of SLOT_BYTES per rank.

Privacy: the mapping carries embedding sums and logits, which give the prompt back, and /dev/shm
is writable by every local user. Rank 0 creates the file under an unguessable name with O_EXCL,
O_NOFOLLOW and mode 0600, so a file or symlink planted at the path fails the start instead of
being used; every rank maps it only after fstat shows a regular file of ours, mode 0600 or
stricter, of exactly the expected size. The path reaches the other ranks over the group's
private channel (runtime/parallel/group.py).

Invariants:
  - Every rank calls the same collectives in the same order (the caller's contract), so call
    number s is the same collective on every rank.
  - Rank r publishes s (control[r] = s) only after its slot of buffer s % 2 holds its data for
    call s; it writes that slot only after every rank published s - 1, that is after every rank
    finished reading buffer s % 2 for call s - 2.
  - Reductions sum the slots in rank order on every rank, so every rank gets the same bits.
  - Stores are made visible in program order (x86's total store order; torch's multi-threaded
    copies end with a join that orders them): `available()` is False on other CPUs and the
    group uses gloo there.
A rank that dies leaves the others spinning: the spin checks the peers' pids every
PEER_CHECK_S and raises, as a failed gloo collective would.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import platform
import secrets
import stat
import time

import numpy as np
import torch

SLOT_BYTES = 8 << 20  # per rank and buffer: hidden states of a 2048-token chunk in fp32 fit (~7.5 MB at 896 wide)
CONTROL_BYTES = 64  # per rank: its sequence number, one cache line each
PEER_CHECK_S = 0.5
YIELD_AFTER = 2000  # spins before each sched_yield(), so other processes on the cores get a turn
SHM_DIR = "/dev/shm"


def available() -> bool:
    return platform.machine().lower() in ("x86_64", "amd64") and os.path.isdir(SHM_DIR)


def mapping_size(size: int) -> int:
    return size * CONTROL_BYTES + 2 * size * SLOT_BYTES


def new_path() -> str:
    """A fresh, unguessable path for a group's mapping."""
    return os.path.join(SHM_DIR, f"radixserve-tp-{secrets.token_hex(16)}")


def open_checked(path: str, size: int) -> int:
    """An O_RDWR descriptor of the mapping's file, after checking it is the file rank 0 made.

    Raises:
        RuntimeError: a symlink, not a regular file, not ours, readable or writable by others, or
            not `mapping_size(size)` bytes.
    """
    try:
        # O_NONBLOCK: a FIFO planted at the path must fail the checks, not hang the open.
        fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError as e:  # ELOOP: a symlink
        raise RuntimeError(f"cannot open tensor-parallel shared memory {path}: {e}") from None
    st = os.fstat(fd)
    problem = _problem(st, mapping_size(size))
    if problem:
        os.close(fd)
        raise RuntimeError(f"refusing tensor-parallel shared memory {path}: {problem}")
    return fd


def _problem(st: os.stat_result, want_bytes: int) -> str:
    """Why a file with status `st` is not our mapping ("" when it is)."""
    if not stat.S_ISREG(st.st_mode):
        return "not a regular file"
    if st.st_uid != os.getuid():
        return f"owned by uid {st.st_uid}, not {os.getuid()}"
    if st.st_mode & 0o077:
        return f"mode {stat.S_IMODE(st.st_mode):04o} lets other users in"
    if st.st_size != want_bytes:
        return f"{st.st_size} bytes, expected {want_bytes}"
    return ""


class ShmCollectives:
    """One rank's view of the shared mapping, a file made by `ShmCollectives.create(path, size)`."""

    def __init__(self, path: str, rank: int, size: int, peer_pids: list[int]) -> None:
        self.rank, self.size = rank, size
        self.peer_pids = [pid for r, pid in enumerate(peer_pids) if r != rank]
        fd = open_checked(path, size)
        try:
            self.mem = mmap.mmap(fd, mapping_size(size))
        finally:
            os.close(fd)
        self.control = np.frombuffer(self.mem, dtype=np.int64, count=size * CONTROL_BYTES // 8)[:: CONTROL_BYTES // 8]
        self.data = torch.frombuffer(self.mem, dtype=torch.uint8, offset=size * CONTROL_BYTES,
                                     count=2 * size * SLOT_BYTES).view(2, size, SLOT_BYTES)
        self.seq = 0

    @staticmethod
    def create(path: str, size: int) -> None:
        """Create the mapping's file for a group of `size` ranks: new (never an existing file or a
        symlink), ours, mode 0600.

        Raises:
            RuntimeError: something already exists at `path` (planted by another user, or a stale run).
        """
        flags = os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_RDWR | os.O_CLOEXEC
        try:
            fd = os.open(path, flags, 0o600)
        except FileExistsError:
            raise RuntimeError(f"refusing to use {path} for tensor-parallel shared memory: something "
                               "already exists there (a planted file or symlink?)") from None
        try:
            os.fchmod(fd, 0o600)  # exactly 0600 whatever the umask took away
            os.ftruncate(fd, mapping_size(size))
        except BaseException:
            os.unlink(path)
            raise
        finally:
            os.close(fd)

    def fits(self, x: torch.Tensor) -> bool:
        return x.numel() * x.element_size() <= SLOT_BYTES

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """Sum over the ranks, into `x` (in place)."""
        slots = self._exchange(x)
        if self.size == 2:
            torch.add(slots[0], slots[1], out=x)
        else:
            torch.sum(torch.stack(slots), dim=0, out=x)
        return x

    def all_gather(self, x: torch.Tensor) -> torch.Tensor:
        """[size, *x.shape]: every rank's `x`, in rank order."""
        return torch.stack(self._exchange(x))

    def broadcast_(self, x: torch.Tensor) -> torch.Tensor:
        """Rank 0's `x` into `x` on every rank."""
        slots = self._exchange(x if self.rank == 0 else None, like=x)
        if self.rank != 0:
            x.copy_(slots[0])
        return x

    def _exchange(self, x: torch.Tensor | None, like: torch.Tensor | None = None) -> list[torch.Tensor]:
        """Publish `x` (None: publish nothing, only take part) as call `seq + 1`; return every
        rank's slot viewed as the tensor's dtype and shape, once all have published. The views
        are valid until this rank's call seq + 2 (the buffer's next use)."""
        ref = x if x is not None else like
        assert ref is not None
        seq = self.seq = self.seq + 1
        nbytes = ref.numel() * ref.element_size()
        buf = self.data[seq % 2]
        self._wait_all(seq - 1)  # every rank has finished reading this buffer's call seq - 2
        if x is not None:
            buf[self.rank, :nbytes].view(ref.dtype).view(ref.shape).copy_(x)
        self.control[self.rank] = seq
        self._wait_all(seq)
        return [buf[r, :nbytes].view(ref.dtype).view(ref.shape) for r in range(self.size)]

    def _wait_all(self, seq: int) -> None:
        control = self.control
        spins = 0
        next_check = None
        while int(control.min()) < seq:
            spins += 1
            if spins % YIELD_AFTER == 0:
                os.sched_yield()
                now = time.monotonic()
                if next_check is None:
                    next_check = now + PEER_CHECK_S
                elif now >= next_check:
                    self._check_peers()
                    next_check = now + PEER_CHECK_S

    def _check_peers(self) -> None:
        for pid in self.peer_pids:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                raise RuntimeError(f"a tensor-parallel rank (pid {pid}) died during a collective") from None

    def close(self) -> None:
        self.control = None  # type: ignore[assignment]
        self.data = None  # type: ignore[assignment]
        with contextlib.suppress(BufferError):  # a view still alive: the mapping goes with the process
            self.mem.close()
