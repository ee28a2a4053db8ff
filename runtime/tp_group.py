"""The tensor-parallel group: torch.distributed over a private rendezvous, and its collectives.

Rendezvous: a file in the launch's 0700 IPC directory (`file://` init), so nothing listens for
strangers. Gloo and NCCL then connect the ranks to each other over TCP; GLOO_SOCKET_IFNAME and
NCCL_SOCKET_IFNAME are set to the loopback interface (unless the user set them) so those
sockets bind to 127.0.0.1 only.

Backends: on CPU, shared memory for tensors (runtime/shm_collectives.py; RADIXSERVE_TP_SHM=0
turns it off) and gloo for the rest; NCCL on CUDA (plus a gloo group for the pickled step
descriptions that rank 0 broadcasts, which live on the host).

Timeout: the group's timeout is long (IDLE_TIMEOUT) because the other ranks wait in a broadcast
for rank 0's next step for as long as the server is idle. A rank that dies closes its sockets
and the others' next collective fails at once; a rank that hangs inside a forward stops rank 0's
progress, which the scheduler's watchdog reports.
"""

from __future__ import annotations

import datetime
import os
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from runtime import env, shm_collectives
from runtime.models.sharding import ShardPlan, even_split
from runtime.shm_collectives import ShmCollectives

IDLE_TIMEOUT = datetime.timedelta(days=30)
RENDEZVOUS_FILE = "tp-rendezvous"


class TPGroup:
    """The collectives one rank calls; every rank must call the same ones in the same order.

    On CPU the tensor collectives go through shared memory (`runtime/shm_collectives.py`) when
    the tensor fits a slot, else through gloo; the pickled step descriptions always go through
    gloo, whose blocking receive lets an idle follower sleep instead of spin.
    """

    def __init__(self, rank: int, size: int, device: torch.device, shm: ShmCollectives | None = None) -> None:
        self.rank, self.size, self.device = rank, size, device
        # Pickled objects travel through host memory: a gloo group even when tensors use NCCL.
        self.host_group = dist.new_group(backend="gloo") if device.type == "cuda" else None
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

    def broadcast_object(self, obj: Any) -> Any:
        """Rank 0's `obj` (pickled) on every rank; other ranks pass None."""
        box = [obj]
        dist.broadcast_object_list(box, src=0, group=self.host_group)
        return box[0]

    def min_int(self, value: int) -> int:
        """The smallest `value` over the ranks (KV capacity: every rank must hold the same slots)."""
        t = torch.tensor([value], dtype=torch.int64, device=self.device)
        dist.all_reduce(t, op=dist.ReduceOp.MIN)
        return int(t.item())

    def close(self) -> None:
        if self.shm is not None:
            self.shm.close()
            self.shm = None
        if dist.is_initialized():
            dist.destroy_process_group()


@dataclass(frozen=True)
class TensorParallel:
    """What a sharded model needs: its part (`plan`) and the collectives (`group`)."""

    plan: ShardPlan
    group: TPGroup

    def gather_vocab(self, local_logits: torch.Tensor, vocab_size: int) -> torch.Tensor:
        """[N, local vocab] on each rank -> [N, vocab] on every rank (slices padded to one width
        for the gather, then trimmed)."""
        plan = self.plan
        pad = plan.vocab_stride - local_logits.shape[1]
        if pad:
            local_logits = torch.nn.functional.pad(local_logits, (0, pad))
        parts = self.group.all_gather(local_logits)
        widths = [len(even_split(vocab_size, plan.size, r)) for r in range(plan.size)]
        return torch.cat([parts[r, :, :w] for r, w in enumerate(widths)], dim=1)


def init_tp_group(rank: int, size: int, ipc_path: str, device: torch.device) -> TPGroup:
    """Join the group of `size` ranks (blocks until all have joined)."""
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    os.environ.setdefault("NCCL_SOCKET_IFNAME", "lo")
    backend = "nccl" if device.type == "cuda" else "gloo"
    dist.init_process_group(
        backend, init_method=f"file://{os.path.join(ipc_path, RENDEZVOUS_FILE)}", rank=rank, world_size=size,
        timeout=IDLE_TIMEOUT,
    )
    use_shm = device.type == "cpu" and shm_collectives.available() and env.get_bool("TP_SHM", True)
    shm = _map_shared(ipc_path, rank, size) if use_shm else None
    return TPGroup(rank, size, device, shm)


def _map_shared(ipc_path: str, rank: int, size: int) -> ShmCollectives:
    """Rank 0 creates the mapping's file, every rank maps it, then rank 0 unlinks it (the
    mappings stay; nothing is left in /dev/shm even if a rank is killed later)."""
    pids: list[int] = [0] * size
    dist.all_gather_object(pids, os.getpid())
    path = os.path.join("/dev/shm", f"radixserve-tp-{os.path.basename(ipc_path)}-{pids[0]}")
    if rank == 0:
        ShmCollectives.create(path, size)
    dist.barrier()
    shm = ShmCollectives(path, rank, size, pids)
    dist.barrier()
    if rank == 0:
        os.unlink(path)
    return shm
