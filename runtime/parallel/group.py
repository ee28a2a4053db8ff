"""The tensor-parallel group: torch.distributed for tensors, a private channel for messages.

Rendezvous: a file in the launch's 0700 IPC directory (`file://` init), so nothing listens for
strangers. Gloo and NCCL then connect the ranks to each other over TCP; GLOO_SOCKET_IFNAME and
NCCL_SOCKET_IFNAME are set to the loopback interface (unless the user set them) so those
sockets bind to 127.0.0.1 only.

Backends: on CPU, shared memory for tensors (runtime/parallel/shm_collectives.py; RADIXSERVE_TP_SHM=0
turns it off) and gloo for the rest; NCCL on CUDA.

Messages (the step descriptions rank 0 sends, the shared memory's path): `StepChannel`, ZMQ
PUSH/PULL over `ipc://` sockets in the same 0700 directory, encoded by `runtime.contracts.codec` (JSON,
never pickle). Gloo's and NCCL's TCP listeners on 127.0.0.1 accept any local process, and
torch's `*_object*` collectives unpickle what arrives: nothing between ranks goes through them,
so a stranger who connects can at worst corrupt numbers or stall the group, not run code. A
follower waits for the next step in a blocking poll, asleep, however long the server is idle.

Timeout: the group's timeout is long (IDLE_TIMEOUT): a rank that is slow inside a forward (a
long prefill on shared cores) must not fail its peers' collective. A rank that dies closes its
sockets and the others' next collective fails at once; a rank that hangs inside a forward stops
rank 0's progress, which the scheduler's watchdog reports.
"""

from __future__ import annotations

import datetime
import os
import stat
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from runtime.contracts import env
from runtime.contracts.ipc import IpcDir, PullSocket, PushSocket, new_context
from runtime.contracts.messages import TPSharedMemory
from runtime.parallel import shm_collectives
from runtime.parallel.sharding import ShardPlan
from runtime.parallel.shm_collectives import ShmCollectives

IDLE_TIMEOUT = datetime.timedelta(days=30)
RENDEZVOUS_FILE = "tp-rendezvous"
LEADER_CHECK_S = 1.0  # how often a waiting follower checks that rank 0 is alive


class StepChannel:
    """Messages from rank 0 to every other rank, over the launch's private IPC directory.

    Rank 0 pushes each message to one socket per follower (each follower binds its own, so only
    rank 0 sends to it); `send` returns at once. A follower's `receive` sleeps in a poll and,
    every LEADER_CHECK_S, checks that rank 0's process still exists, since a dead sender does not
    close a PULL socket.
    """

    def __init__(self, ipc_path: str, rank: int, size: int) -> None:
        ipc = IpcDir(ipc_path)
        self.leader_pid: int | None = None  # known once the group has exchanged pids
        self._ctx = new_context()
        self._out: list[PushSocket] = []
        self._in: PullSocket | None = None
        if rank == 0:
            self._out = [PushSocket(self._ctx, ipc.endpoint(f"tp-steps-{r}")) for r in range(1, size)]
        else:
            self._in = PullSocket(self._ctx, ipc.endpoint(f"tp-steps-{rank}"), bind=True)

    def send(self, msg: Any) -> None:
        """Rank 0: queue `msg` (a `runtime.contracts.messages` type) for every follower."""
        for sock in self._out:
            sock.send(msg)

    def receive(self) -> Any:
        """A follower: the next message from rank 0.

        Raises:
            RuntimeError: rank 0's process is gone.
        """
        assert self._in is not None, "rank 0 only sends"
        while True:
            msg = self._in.recv(timeout_ms=int(LEADER_CHECK_S * 1000))
            if msg is not None:
                return msg
            if self.leader_pid is not None and not _alive(self.leader_pid):
                raise RuntimeError(f"tensor-parallel rank 0 (pid {self.leader_pid}) is gone")

    def close(self) -> None:
        """Close the sockets (a queued message gets the sockets' linger to go out)."""
        for sock in self._out:
            sock.close()
        if self._in is not None:
            self._in.close()
        self._out, self._in = [], None
        self._ctx.term()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


class TPGroup:
    """The collectives one rank calls; every rank must call the same ones in the same order.

    On CPU the tensor collectives go through shared memory (`runtime/parallel/shm_collectives.py`) when
    the tensor fits a slot, else through gloo; messages go through `channel`.
    """

    def __init__(self, rank: int, size: int, device: torch.device, channel: StepChannel,
                 shm: ShmCollectives | None = None) -> None:
        self.rank, self.size, self.device = rank, size, device
        self.channel = channel
        self.shm = shm

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """Sum `x` over the ranks, in place."""
        if self.shm is not None and self.shm.fits(x):
            return self.shm.all_reduce(x)
        dist.all_reduce(x)
        return x

    def all_gather(self, x: torch.Tensor) -> torch.Tensor:
        """[size, *x.shape]: every rank's `x` (same shape on every rank), rank order."""
        x = x.contiguous()
        if self.shm is not None and self.shm.fits(x):
            return self.shm.all_gather(x)
        out = x.new_empty((self.size, *x.shape))
        dist.all_gather(list(out.unbind(0)), x)
        return out

    def broadcast_(self, x: torch.Tensor) -> torch.Tensor:
        """Rank 0's `x` on every rank, in place."""
        if self.shm is not None and self.shm.fits(x):
            return self.shm.broadcast_(x)
        dist.broadcast(x, src=0)
        return x

    def broadcast_message(self, msg: Any) -> Any:
        """Rank 0's `msg` (a `runtime.contracts.messages` type) on every rank: rank 0 sends it and returns
        at once; the others pass None and wait, asleep, until it arrives."""
        if self.rank == 0:
            self.channel.send(msg)
            return msg
        return self.channel.receive()

    def min_int(self, value: int) -> int:
        """The smallest `value` over the ranks (KV capacity: every rank must hold the same slots)."""
        t = torch.tensor([value], dtype=torch.int64, device=self.device)
        dist.all_reduce(t, op=dist.ReduceOp.MIN)
        return int(t.item())

    def close(self) -> None:
        if self.shm is not None:
            self.shm.close()
            self.shm = None
        self.channel.close()
        if dist.is_initialized():
            dist.destroy_process_group()


@dataclass(frozen=True)
class TensorParallel:
    """What a sharded model needs: its part (`plan`) and the collectives (`group`)."""

    plan: ShardPlan
    group: TPGroup


def init_tp_group(rank: int, size: int, ipc_path: str, device: torch.device) -> TPGroup:
    """Join the group of `size` ranks (blocks until all have joined).

    Raises:
        RuntimeError: `ipc_path` is not a private directory (ours, no group or other access).
    """
    _check_private(ipc_path)
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    os.environ.setdefault("NCCL_SOCKET_IFNAME", "lo")
    backend = "nccl" if device.type == "cuda" else "gloo"
    dist.init_process_group(
        backend, init_method=f"file://{os.path.join(ipc_path, RENDEZVOUS_FILE)}", rank=rank, world_size=size,
        timeout=IDLE_TIMEOUT,
    )
    channel = StepChannel(ipc_path, rank, size)
    try:
        pids = _gather_pids(device)
        channel.leader_pid = pids[0]
        use_shm = device.type == "cpu" and shm_collectives.available() and env.get_bool("TP_SHM", True)
        shm = _map_shared(channel, rank, size, pids) if use_shm else None
    except BaseException:
        channel.close()
        raise
    return TPGroup(rank, size, device, channel, shm)


def _check_private(ipc_path: str) -> None:
    """The rendezvous file and the channel's sockets are private only inside a private directory."""
    st = os.stat(ipc_path)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
        raise RuntimeError(f"tensor parallelism needs a private IPC directory (ours, mode 0700): {ipc_path}")


def _gather_pids(device: torch.device) -> list[int]:
    """Every rank's pid, in rank order (a tensor all-gather: no pickled objects between ranks)."""
    mine = torch.tensor([os.getpid()], dtype=torch.int64, device=device)
    parts = [torch.empty_like(mine) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, mine)
    return [int(p.item()) for p in parts]


def _map_shared(channel: StepChannel, rank: int, size: int, pids: list[int]) -> ShmCollectives:
    """Rank 0 creates the mapping's file (unguessable name, mode 0600) and sends its path over
    the private channel; every rank checks and maps it, then rank 0 unlinks it (the mappings
    stay; nothing is left in /dev/shm even if a rank is killed later)."""
    if rank != 0:
        msg = channel.receive()
        assert isinstance(msg, TPSharedMemory), f"expected TPSharedMemory, got {type(msg).__name__}"
        shm = ShmCollectives(msg.path, rank, size, pids)
        dist.barrier()
        return shm
    path = shm_collectives.new_path()
    ShmCollectives.create(path, size)
    try:
        channel.send(TPSharedMemory(path))
        shm = ShmCollectives(path, rank, size, pids)
        dist.barrier()  # every rank has mapped it
    finally:
        os.unlink(path)
    return shm
