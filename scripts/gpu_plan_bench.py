"""The GPU check's plan stage: the host cost of a decode step's attention plan at batch 1, 32 and
256 (1024 tokens of context each), with FlashInfer's plan data staged in our two alternating
pinned buffers (kernels/flashinfer_staging.py) and, for comparison, in pageable memory (what the
backend did before). Each is timed twice: with the GPU idle, and queued behind 20 ms of GPU work,
where a plan() whose copy made the host wait would take the 20 ms. The answer to whether pageable
staging blocks the host is that second number.

Run through scripts/gpu_check.py --stage plan. All figures are "info" records.
"""

from __future__ import annotations

import contextlib
import statistics
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch

from kernels.flashinfer_staging import STAGING_ATTR
from runtime.execution.forward_batch import ForwardEntry

BUSY_MS = 20
CYCLES_PER_MS = 1_980_000  # H200 boost clock; the sleep's real length is measured with events


class PageableStaging:
    """Stands in for the backend's PlanStaging: every plan gets a fresh pageable buffer."""

    waits = 0

    @contextlib.contextmanager
    def plan(self, wrapper: Any) -> Iterator[None]:
        own = getattr(wrapper, STAGING_ATTR)
        setattr(wrapper, STAGING_ATTR, torch.empty(own.shape, dtype=own.dtype, device="cpu"))
        yield


def _decodes(batch: int, context: int) -> list[ForwardEntry]:
    region = context + 1
    return [ForwardEntry(row=r, input_ids=[5], prefix_len=context, kv_write=[1 + r * region + context],
                         kv_write_start=context) for r in range(batch)]


def _host_us(fn: Callable[[], object], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return 1e6 * statistics.median(times)


def _behind_busy_gpu_ms(runner: Any, meta: Any) -> tuple[float, float]:
    """(host ms of one plan queued behind BUSY_MS of GPU sleep, the sleep's measured ms)."""
    begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    begin.record()
    torch.cuda._sleep(BUSY_MS * CYCLES_PER_MS)
    end.record()
    start = time.perf_counter()
    runner.backend.plan(meta)
    host_ms = 1e3 * (time.perf_counter() - start)
    torch.cuda.synchronize()
    return host_ms, begin.elapsed_time(end)


def _measure(runner: Any, batch: int, context: int, repeats: int) -> dict[str, Any]:
    """One batch's host times (on the runner's stream, as a forward runs them)."""
    entries = _decodes(batch, context)
    meta = runner.prepare(entries).meta
    fields: dict[str, Any] = {
        "prepare_us": round(_host_us(lambda: runner.prepare(entries), repeats), 1),
        "plan_us": round(_host_us(lambda: runner.backend.plan(meta), repeats), 1),
    }
    if runner.device.type == "cuda":
        host_ms, gpu_ms = _behind_busy_gpu_ms(runner, meta)
        fields.update(plan_behind_busy_gpu_ms=round(host_ms, 2), gpu_busy_ms=round(gpu_ms, 1))
    fields["staging_waits"] = runner.backend.staging.waits
    return fields


def run(report: Any, runner: Any, dry_run: bool) -> None:
    batches, context = ((1, 4), 64) if dry_run else ((1, 32, 256), 1024)
    for staging in ("pinned_pair", "pageable"):
        if staging == "pageable":
            runner.backend.staging = PageableStaging()
        for batch in batches:
            with torch.inference_mode(), runner._on_stream():  # the runner's stream, as forward()
                fields = _measure(runner, batch, context, 5 if dry_run else 50)
            report.info("plan_speed", staging=staging, batch=batch, context=context, **fields)
