"""Decode attention per layer: our C++ kernel against the torch way, in the same run.

For each batch size and context length, every request's one query row per head attends to its
KV slots in a pool of one layer, laid out as the server's ([slots, kv_heads, head_dim]):
- `torch`: gather each request's K/V into a padded buffer, then one SDPA (the path without the
  kernels), the baseline;
- `kernel`: kernels/csrc/decode_attention.cpp straight from the pool.
Slots are scattered (`--slots random`, a pool after churn) or each request's run of slots is
contiguous (`contiguous`, a fresh pool); `--shared N` gives every request the same first N slots
(a shared prompt prefix from the radix cache). Prints microseconds per layer, the KV bytes read
per second by the kernel and its ratio to torch; appends JSON lines to `--output`.

    .venv/bin/python scripts/bench_decode_attention.py --batch-size 1 16 64 --context 300 1152 --shared 0 1024
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from runtime.execution.cpu_kernels import load_cpu_kernels  # noqa: E402


def per_call(fn, seconds: float) -> float:
    fn()
    calls, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        fn()
        calls += 1
    return (time.perf_counter() - start) / calls


def measure(kernels, k_pool: torch.Tensor, v_pool: torch.Tensor, slots: torch.Tensor, q: torch.Tensor,
            context: int, seconds: float) -> tuple[float, float]:
    """(kernel, torch) seconds per call for `q` [B, H, D] over `context` slots per request."""
    batch, heads, d = q.shape
    kvh = k_pool.shape[1]
    indptr = torch.arange(batch + 1, dtype=torch.int64) * context
    scale = d**-0.5

    def ours() -> None:
        kernels.decode_attention(q, k_pool, v_pool, slots, indptr, scale)

    def torch_way() -> None:
        k = k_pool[slots].view(batch, context, kvh, d).transpose(1, 2)
        v = v_pool[slots].view(batch, context, kvh, d).transpose(1, 2)
        F.scaled_dot_product_attention(q.view(batch, kvh, heads // kvh, d), k, v, scale=scale)

    return per_call(ours, seconds), per_call(torch_way, seconds)


def request_slots(order: torch.Tensor, batch: int, context: int, shared: int) -> torch.Tensor:
    """Every request's slots, row after row: the shared first `shared`, then its own."""
    prefix, rest, own = order[:shared], order[shared:], context - shared
    return torch.cat([torch.cat([prefix, rest[b * own:(b + 1) * own]]) for b in range(batch)])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batch-size", type=int, nargs="+", default=[1, 16, 64])
    parser.add_argument("--context", type=int, nargs="+", default=[300, 1152])
    parser.add_argument("--shared", type=int, nargs="+", default=[0], help="slots every request shares first")
    parser.add_argument("--slots", choices=["random", "contiguous"], default="random")
    parser.add_argument("--dtype", choices=["bfloat16", "float32"], default="bfloat16")
    parser.add_argument("--heads", type=int, default=9, help="query heads (the default model's 9, 3 KV heads, 64)")
    parser.add_argument("--kv-heads", type=int, default=3)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--seconds", type=float, default=1.0)
    parser.add_argument("--output", default="results/bench_decode_attention.jsonl")
    args = parser.parse_args()
    kernels = load_cpu_kernels()
    assert kernels is not None, "the C++ CPU kernels are not built: run `python -m runtime.execution.cpu_kernels build`"
    dtype, kvh, d = getattr(torch, args.dtype), args.kv_heads, args.head_dim
    pool_slots = 200_000  # 150 MB in bf16: beyond the last-level cache, as a server's pool is
    gen = torch.Generator().manual_seed(0)
    k_pool = torch.randn(pool_slots, kvh, d, generator=gen).to(dtype)
    v_pool = torch.randn(pool_slots, kvh, d, generator=gen).to(dtype)
    print(f"torch threads {torch.get_num_threads()}; {args.dtype}, {args.heads} heads over {kvh} KV heads of {d}; "
          f"{args.slots} slots")
    os.makedirs(os.path.dirname(args.output) or ".", exist_ok=True)
    for batch in args.batch_size:
        for context in args.context:
            for shared in [s for s in args.shared if s < context]:
                random_order = args.slots == "random"
                order = torch.randperm(pool_slots, generator=gen) if random_order else torch.arange(pool_slots)
                slots = request_slots(order, batch, context, shared)
                q = torch.randn(batch, args.heads, d, generator=gen).to(dtype)
                t_kernel, t_torch = measure(kernels, k_pool, v_pool, slots, q, context, args.seconds)
                kv_bytes = 2 * batch * context * kvh * d * k_pool.element_size()
                row = dict(batch=batch, context=context, shared=shared, slots=args.slots, dtype=args.dtype,
                           kernel_us=t_kernel * 1e6, torch_us=t_torch * 1e6, kernel_gb_s=kv_bytes / t_kernel / 1e9,
                           date=datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"))
                print(f"B={batch:3d} context {context:5d} shared {shared:5d}: torch {row['torch_us']:8.0f} us  "
                      f"kernel {row['kernel_us']:7.0f} us ({t_torch / t_kernel:.2f}x, "
                      f"{row['kernel_gb_s']:.1f} GB/s of KV)")
                with open(args.output, "a") as out:
                    out.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
