"""Host staging for FlashInfer's plan(): two pinned buffers used alternately, each guarded by an event.

plan() writes its scheduling data into the wrapper's pinned host buffer
(`_pin_memory_int_workspace_buffer`) and queues an asynchronous copy of it to the device on the
current stream, with no fence: a second plan() before that copy has run would overwrite the data
it is about to read. (The GPU can be a whole step behind the host in the overlap loop.)

Pageable memory instead of pinned avoids the race (the driver stages such a copy at once) but may
make the host wait on the copy, losing the overlap; scripts/gpu_plan_bench.py measures both.
So plans alternate between two pinned buffers, and an event recorded after each plan marks when
its copy has run: plan k waits only for plan k-2's copy, which in practice has long finished.

All the backend's wrappers (prefill, decode, and one decode wrapper per CUDA-graph bucket) share
one pair: only one plan is in flight per step, and FlashInfer gives each wrapper its own 8 MiB
pinned buffer otherwise (35 graph buckets: 280 MiB of pinned host memory).

Invariant: the buffer plan k writes is never the one an unfinished copy reads.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any, Protocol

import torch

STAGING_ATTR = "_pin_memory_int_workspace_buffer"  # FlashInfer's private name (0.6.x)


class Event(Protocol):
    """torch.cuda.Event's part we use."""

    def record(self) -> None: ...
    def query(self) -> bool: ...
    def synchronize(self) -> None: ...


class PlanStaging:
    """The pair of staging buffers of one attention backend.

    `new_event`: makes the event recorded after each plan (torch.cuda.Event on a GPU). None on CPU,
    where copies are synchronous and nothing needs guarding (the buffers still alternate).
    """

    def __init__(self, nbytes: int, pin: bool, new_event: Callable[[], Event] | None) -> None:
        self.buffers = [torch.empty(nbytes, dtype=torch.uint8, pin_memory=pin) for _ in range(2)]
        self.copied: list[Event | None] = [None, None]  # the event after the last plan into each buffer
        self.new_event = new_event
        self.turn = 0
        self.waits = 0  # plans that found their buffer's copy still queued (host waits)

    @classmethod
    def for_device(cls, device: torch.device, nbytes: int = 8 << 20) -> PlanStaging:
        cuda = device.type == "cuda"
        return cls(nbytes, pin=cuda, new_event=torch.cuda.Event if cuda else None)

    def adopt(self, wrapper: Any) -> None:
        """Point a new wrapper at the shared buffers, freeing its own (plan() re-points it)."""
        own = getattr(wrapper, STAGING_ATTR, None)
        if isinstance(own, torch.Tensor):
            needed, shared = own.numel() * own.element_size(), self.buffers[0].numel()
            if needed > shared:
                raise ValueError(f"a wrapper stages {needed} bytes, more than the shared {shared}")
            setattr(wrapper, STAGING_ATTR, self.buffers[self.turn])

    @contextlib.contextmanager
    def plan(self, wrapper: Any) -> Iterator[None]:
        """Around one wrapper.plan(): hand it the buffer no queued copy reads, then mark its copy."""
        pending = self.copied[self.turn]
        if pending is not None:
            if not pending.query():
                self.waits += 1
            pending.synchronize()
        if hasattr(wrapper, STAGING_ATTR):
            setattr(wrapper, STAGING_ATTR, self.buffers[self.turn])
        yield
        if self.new_event is not None:
            event = self.new_event()
            event.record()  # on the current stream: the one plan() queued its copy on
            self.copied[self.turn] = event
        self.turn ^= 1
