"""Host <-> device traffic of a forward step: in one place, asynchronous where it can be, counted.

On CUDA a plain `torch.tensor(values, device="cuda")` copies from pageable memory and blocks the
host until the copy is done, and `.tolist()` / `.item()` / `bool(t)` on a device tensor wait for
every kernel queued before it. A decode step that does either per request loses the overlap of
the host's work with the GPU's. So the runner builds everything a step needs on the host (it knows
every length already), uploads it with `upload()` (pinned memory, `non_blocking=True`: the copy
is queued on the stream like a kernel; torch's pinned-memory allocator keeps the host buffer
until the copy has run) and reads results back with `read_back()`, the one wait of a step.

`STATS` counts both, on every device, so a CPU test can assert that a decode step makes one
upload and no wait (the CPU's "copies" are free, but the same code runs on CUDA).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch


@dataclass
class TransferStats:
    uploads: int = 0  # host -> device copies (asynchronous on CUDA)
    syncs: int = 0  # waits of the host for the device (reading results back)

    def reset(self) -> None:
        self.uploads = 0
        self.syncs = 0


STATS = TransferStats()


Device = torch.device | str


def upload(
    values: Sequence[int] | Sequence[float] | Sequence[list[float]], dtype: torch.dtype, device: Device
) -> torch.Tensor:
    """`values` as a tensor on `device`, copied without blocking the host."""
    STATS.uploads += 1
    device = torch.device(device)
    if device.type == "cpu":
        return torch.tensor(values, dtype=dtype)
    return torch.tensor(values, dtype=dtype, pin_memory=True).to(device, non_blocking=True)


def upload_tensor(host: torch.Tensor, device: Device) -> torch.Tensor:
    """A host tensor built elsewhere (a grammar bitmask), copied to `device` without blocking."""
    STATS.uploads += 1
    device = torch.device(device)
    if device.type == "cpu":
        return host
    return host.pin_memory().to(device, non_blocking=True)


def host_tensor(values: Sequence[int], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """`values` as a host tensor, pinned when `device` is a GPU: for APIs that read lengths on
    the host (FlashInfer's plan()) and copy them to the device themselves, asynchronously."""
    return torch.tensor(values, dtype=dtype, pin_memory=device.type == "cuda")


class PendingHost:
    """Device tensors being copied to pinned host memory; `wait()` is the step's one sync."""

    def __init__(self, tensors: Sequence[torch.Tensor]) -> None:
        self.device = tensors[0].device if tensors else torch.device("cpu")
        if self.device.type == "cuda":
            self.host = [t.to("cpu", non_blocking=True) for t in tensors]
            self.event: torch.cuda.Event | None = torch.cuda.Event()
            self.event.record()
        else:
            self.host, self.event = list(tensors), None
        self.lists: list[list] | None = None

    def wait(self) -> list[list]:
        """The tensors' values as lists (waits for the copies once; later calls are free)."""
        if self.lists is None:
            STATS.syncs += 1
            if self.event is not None:
                self.event.synchronize()
            self.lists = [t.tolist() for t in self.host]
        return self.lists
