"""Batches that exercise every attention path of a runner, step by step, for comparing backends.

Each scenario is a list of steps (lists of ForwardEntry) over fresh rows and page-aligned KV slots:
whole prefills, a prefill over a cached prefix, a chunked prefill, a mixed batch (a chunk plus
decodes) and decode steps. `run_scenario` returns every step's logits, so two runners (the torch
backend and FlashInfer; eager and CUDA graphs) can be compared step by step. Used by the CPU tests
(FlashInfer's stand-in) and by scripts/gpu_check.py on a GPU (the real one).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from runtime.execution.forward_batch import ForwardEntry

REGION = 256  # KV slots per request (rows never share slots unless a scenario says so)
# Two bf16 runners on the same weights (FlashInfer has no fp32 kernels): their logits (of order 1
# with dummy weights) differ by rounding, a few bf16 ulps at most (2^-7 ~ 0.008 in [1, 2); the CPU
# stand-in against the torch backend differs by 0.004).
BF16_LOGIT_TOLERANCE = 2e-2


def _ids(row: int, n: int, start: int = 0) -> list[int]:
    return [(row * 31 + i * 7) % 400 + 1 for i in range(start, start + n)]


def _slots(row: int, start: int, end: int) -> list[int]:
    base = REGION * (row + 1)  # page-aligned for page sizes dividing 256; page 0 is padding
    return list(range(base + start, base + end))


def prefill(row: int, n: int) -> ForwardEntry:
    return ForwardEntry(row=row, input_ids=_ids(row, n), prefix_len=0, kv_write=_slots(row, 0, n), kv_write_start=0)


def chunk(row: int, start: int, n: int) -> ForwardEntry:
    return ForwardEntry(row=row, input_ids=_ids(row, n, start), prefix_len=start,
                        kv_write=_slots(row, start, start + n), kv_write_start=start)


def decode(row: int, length: int) -> ForwardEntry:
    """Decode the token at position `length` (its input: a fixed id; the KV of 0..length-1 is there)."""
    return ForwardEntry(row=row, input_ids=_ids(row, 1, length), prefix_len=length,
                        kv_write=_slots(row, length, length + 1), kv_write_start=length)


def cached_prefix(row: int, donor: int, shared: int, n: int) -> ForwardEntry:
    """A new request whose first `shared` tokens are `donor`'s (its slots, as a cache hit gives)."""
    ids = _ids(donor, shared) + _ids(row, n, shared)
    return ForwardEntry(row=row, input_ids=ids[shared:], prefix_len=shared,
                        kv_write=_slots(donor, 0, shared) + _slots(row, shared, shared + n), kv_write_start=0)


def _decode_steps(lengths: dict[int, int], steps: int) -> list[list[ForwardEntry]]:
    out = []
    for _ in range(steps):
        out.append([decode(row, n) for row, n in lengths.items()])
        lengths = {row: n + 1 for row, n in lengths.items()}
    return out


SCENARIOS: dict[str, Callable[[int], list[list[ForwardEntry]]]] = {
    "prefill": lambda decode_steps: [[prefill(0, 37), prefill(1, 64), prefill(2, 19)]],
    "cached_prefix": lambda decode_steps: [[prefill(0, 48)], [cached_prefix(1, donor=0, shared=32, n=20)]],
    "chunked": lambda decode_steps: [[chunk(0, 0, 32)], [chunk(0, 32, 32)], [chunk(0, 64, 9)]],
    "mixed": lambda decode_steps: [[prefill(0, 21), prefill(1, 30)], [chunk(2, 0, 40), decode(0, 21), decode(1, 30)]],
    "decode": lambda decode_steps: [[prefill(0, 17), prefill(1, 45), prefill(2, 8), prefill(3, 70)]]
    + _decode_steps({0: 17, 1: 45, 2: 8, 3: 70}, decode_steps),
}


def run_scenario(runner, name: str, decode_steps: int = 32) -> list[torch.Tensor]:  # type: ignore[no-untyped-def]
    """Every step's fp32 logits [B, vocab] (on the host)."""
    return [runner.forward(step, keep_logits=True).last_logits.float().cpu() for step in SCENARIOS[name](decode_steps)]


def max_logit_error(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
    return max(float((x - y).abs().max()) for x, y in zip(a, b, strict=True))
