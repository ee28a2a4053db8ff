"""Per-call time of one linear on GGUF blocks, by rows, against the full-precision linear.

For each of the default model's linear shapes and each row count it times, in the same run:
- `packed`: the full-precision weight packed for oneDNN (what the defaults run), the baseline;
- `int`: our integer kernel on the blocks (kernels/csrc/quant_gemm.cpp), in each ISA variant
  this CPU runs (what `--load-format gguf` and `--quantization q8_0|q4_0|q4_1` run).
Weights are cycled over enough copies to exceed the last-level cache, as a decode step streams
them. Prints microseconds per call and each path's ratio to `packed`; appends JSON lines to
`--output`.

    .venv/bin/python scripts/bench_quant_linear.py --format q4_1 --rows 1 4 8 16 32 64
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import time
from collections.abc import Callable
from typing import Any

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from kernels import gguf_blocks as gb  # noqa: E402
from kernels.linear import pack_weight  # noqa: E402
from kernels.quant_linear import ISA_CODES  # noqa: E402
from runtime.execution.cpu_kernels import load_cpu_kernels  # noqa: E402
from runtime.execution.device import cpu_capability  # noqa: E402

# (name, out_features, in_features) of SmolLM2-135M's linears.
SHAPES = [("qkv", 960, 576), ("o", 576, 576), ("gate_up", 3072, 576), ("down", 576, 1536), ("head", 49152, 576)]
COLD_BYTES = 64 << 20  # more than the last-level cache of the machines we run on


def time_calls(fn: Callable[[int], object], copies: int, seconds: float) -> float:
    """Microseconds per call of fn(i), cycling i over the copies."""
    for i in range(copies):
        fn(i)
    calls, start = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - start) < seconds or calls < copies:
        fn(calls % copies)
        calls += 1
    return elapsed / calls * 1e6


def bench_shape(name: str, n: int, k: int, args: argparse.Namespace, kernels: Any, isas: list[str]) -> list[dict]:
    fmt = gb.block_format(args.format)
    dtype = getattr(torch, args.dtype)
    copies = max(2, min(40, COLD_BYTES // (n * k * 2)))
    weights = [torch.randn(n, k) * 0.05 for _ in range(copies)]
    grouped = [gb.interleave_rows(gb.quantize(w, fmt), fmt) for w in weights]
    packed = [pack_weight(w.to(dtype), None) for w in weights]
    records = []
    for rows in args.rows:
        x = torch.randn(rows, k).to(dtype)

        def packed_call(i: int, x: torch.Tensor = x) -> object:
            return torch.ops.mkldnn._linear_pointwise(x, packed[i], None, "none", [], "")

        times = {"packed": time_calls(packed_call, copies, args.seconds)}
        for isa in isas:

            def int_call(i: int, x: torch.Tensor = x, code: int = ISA_CODES[isa]) -> object:
                return kernels.quant_linear(x, grouped[i], fmt.code, code, n)

            times[f"int_{isa}"] = time_calls(int_call, copies, args.seconds)
        cells = "  ".join(f"{key} {us:8.1f} us ({us / times['packed']:.2f}x)" for key, us in times.items())
        print(f"{name:8s} {n:5d}x{k:<5d} rows {rows:4d}  {cells}", flush=True)
        records.append({"shape": name, "out": n, "in": k, "rows": rows, "format": args.format,
                        "dtype": args.dtype, "us": times})
    return records


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--format", default="q4_1", choices=list(gb.FORMATS))
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 4, 8, 16, 32, 64])
    parser.add_argument("--shapes", nargs="+", default=[s[0] for s in SHAPES])
    parser.add_argument("--seconds", type=float, default=0.3, help="time per measurement")
    parser.add_argument("--output", default="results/bench_quant_linear.jsonl")
    args = parser.parse_args()
    kernels = load_cpu_kernels()
    if kernels is None:
        sys.exit("the C++ kernels are not built: make setup")
    cap = cpu_capability()
    isas = ["avx2", "avx512"] if cap.block_kernel_isa == "avx512" else ["avx2"]
    print(f"cpu: {cap.describe()}; threads {torch.get_num_threads()}; {args.format}, {args.dtype} activations")
    stamp = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    records = []
    for name, n, k in SHAPES:
        if name in args.shapes:
            records += bench_shape(name, n, k, args, kernels, isas)
    os.makedirs(os.path.dirname(args.output) or ".", exist_ok=True)
    with open(args.output, "a") as out:
        for record in records:
            out.write(json.dumps({"time": stamp, "cpu": cap.describe(), **record}) + "\n")


if __name__ == "__main__":
    main()
