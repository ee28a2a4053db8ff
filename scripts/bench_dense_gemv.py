"""A decode step's full-precision linears: our GEMV on plain rows against oneDNN on packed weights.

Runs every linear of the default model's decode step once per pass, in the step's order (30
layers of qkv, o, gate_up, down, then the head), each layer with its own weights, so the 538 MB
(fp32) never sit in cache, as in a real step. For each row count it times, in the same run:
- `packed`: the weights packed for oneDNN (what a full-precision model ran before), the baseline;
- `gemv`: our kernel on the plain row-major weights (kernels/csrc/dense_gemv.cpp; what fp32 runs
  for calls of up to kernels.linear.GEMV_MAX_ROWS rows);
- `plain`: oneDNN on the plain weights (what fp32 runs above that).
Prints milliseconds per pass, the read bandwidth and each path's ratio to `packed` (above 1 is
faster); appends JSON lines to `--output`. Alternates the paths pass by pass, so that a machine
whose speed drifts slows all of them alike.

    .venv/bin/python scripts/bench_dense_gemv.py --dtype float32 --rows 1 2 3 4 5 8 16
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from types import ModuleType

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from kernels.linear import GEMV_MAX_ROWS, pack_weight  # noqa: E402
from runtime.execution.cpu_kernels import load_cpu_kernels  # noqa: E402
from runtime.execution.device import cpu_capability  # noqa: E402

LAYERS = 30  # SmolLM2-135M
LAYER_SHAPES = [(960, 576), (576, 576), (3072, 576), (576, 1536)]  # qkv, o, gate_up, down: (out, in)
HEAD = (49152, 576)


def step_paths(xs: dict[int, torch.Tensor], plain: list[torch.Tensor], packed: list[torch.Tensor],
               kernels: ModuleType | None) -> dict[str, Callable[[], object]]:
    """One pass over the step's linears, per path; `xs`: the activation rows, by input width."""
    linear = torch.ops.mkldnn._linear_pointwise
    paths: dict[str, Callable[[], object]] = {
        "packed": lambda: [linear(xs[w.shape[1]], p, None, "none", [], "") for w, p in zip(plain, packed)],
        "plain": lambda: [linear(xs[w.shape[1]], w, None, "none", [], "") for w in plain],
    }
    if kernels is not None:
        paths["gemv"] = lambda: [kernels.dense_gemv(xs[w.shape[1]], w, None) for w in plain]
    return paths


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 2, 3, 4, 5, 8, 16])
    parser.add_argument("--passes", type=int, default=9)
    parser.add_argument("--output", default="results/bench_dense_gemv.jsonl")
    args = parser.parse_args()
    kernels = load_cpu_kernels()
    if kernels is None:
        raise SystemExit("the C++ CPU kernels are not built: run `make setup`")
    dtype = getattr(torch, args.dtype)
    gen = torch.Generator().manual_seed(0)
    shapes = LAYER_SHAPES * LAYERS + [HEAD]
    plain = [(torch.randn(n, k, generator=gen) * 0.05).to(dtype) for n, k in shapes]
    packed = [pack_weight(w, None) for w in plain]
    if any(p is None for p in packed):
        raise SystemExit(f"oneDNN cannot pack {args.dtype} on this CPU: nothing to compare against")
    total_bytes = sum(w.numel() * w.element_size() for w in plain)
    cpu = cpu_capability().describe()
    print(f"{cpu}; {args.dtype}; {total_bytes / 1e6:.0f} MB of weights a pass; ms per pass (median of {args.passes})")
    os.makedirs(os.path.dirname(args.output) or ".", exist_ok=True)
    for rows in args.rows:
        xs = {k: torch.randn(rows, k, generator=gen).to(dtype) for k in (576, 1536)}
        paths = step_paths(xs, plain, packed, kernels if rows <= GEMV_MAX_ROWS else None)
        times: dict[str, list[float]] = {name: [] for name in paths}
        for _ in range(args.passes + 1):  # the first pass warms up
            for name, run in paths.items():
                start = time.perf_counter()
                run()
                times[name].append(time.perf_counter() - start)
        ms = {name: statistics.median(t[1:]) * 1e3 for name, t in times.items()}
        line = "  ".join(f"{name} {v:6.1f} ({total_bytes / v / 1e6:4.1f} GB/s, {ms['packed'] / v:.2f}x)"
                         for name, v in ms.items())
        print(f"rows {rows}: {line}")
        with open(args.output, "a") as fh:
            fh.write(json.dumps({"date": datetime.datetime.now().isoformat(timespec="seconds"), "cpu": cpu,
                                 "dtype": args.dtype, "rows": rows, "ms": ms, "bytes": total_bytes}) + "\n")


if __name__ == "__main__":
    main()
