"""Prefill (extend) attention per layer: our C++ kernel against the torch way, in the same run.

Each case is a batch of requests, every one `new` new tokens over a cached prefix of `prefix`
tokens, attending causally to its KV slots in a one-layer pool laid out as the server's. Both
ways run through `TorchAttentionBackend` (planned once, then timed per layer as the model
calls it, without the pool write):
- `torch`: per request, gather its K/V, then two oneDNN GEMMs and a softmax (bf16) or SDPA (fp32);
- `kernel`: kernels/csrc/prefill_attention.cpp, one call for the batch, straight from the pool.
Prints microseconds per layer and the ratio; appends JSON lines to `--output`.

    .venv/bin/python scripts/bench_prefill_attention.py --cases 1x256 8x256 1x2048 1x128+1024
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from kernels.base import ForwardMetadata  # noqa: E402
from kernels.kv_pool import KVPool  # noqa: E402
from kernels.torch_backend import TorchAttentionBackend  # noqa: E402
from runtime.execution.cpu_kernels import load_cpu_kernels  # noqa: E402


def per_call(fn, seconds: float, rounds: int = 5) -> float:
    """The median over `rounds` of the mean seconds per call (the machine is shared: noisy)."""
    fn()
    means = []
    for _ in range(rounds):
        calls, start = 0, time.perf_counter()
        while calls == 0 or time.perf_counter() - start < seconds / rounds:
            fn()
            calls += 1
        means.append((time.perf_counter() - start) / calls)
    return statistics.median(means)


def metadata(batch: int, new: int, prefix: int, slots: torch.Tensor) -> ForwardMetadata:
    """Page size 1; request b's slots are slots[b * (prefix + new) :][: prefix + new]."""
    seq = prefix + new
    out_loc = torch.cat([slots[b * seq + prefix : (b + 1) * seq] for b in range(batch)])
    cum = lambda step: torch.arange(batch + 1, dtype=torch.int32) * step  # noqa: E731
    return ForwardMetadata(kv_indices=slots.to(torch.int32), positions=torch.arange(prefix, seq).repeat(batch),
                           out_cache_loc=out_loc, page_size=1, seq_lens=[seq] * batch, extend_lens=[new] * batch,
                           qo_indptr_host=cum(new), kv_indptr_host=cum(seq),
                           kv_last_page_len_host=torch.ones(batch, dtype=torch.int32))


def parse_case(text: str) -> tuple[int, int, int]:
    """'8x256' (8 requests of 256 new tokens) or '1x128+1024' (over a 1024-token prefix)."""
    batch, rest = text.split("x")
    new, _, prefix = rest.partition("+")
    return int(batch), int(new), int(prefix or 0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cases", nargs="+", default=["1x256", "8x256", "1x2048", "1x128+1024"])
    parser.add_argument("--slots", choices=["random", "contiguous"], default="random")
    parser.add_argument("--dtype", choices=["bfloat16", "float32"], default="bfloat16")
    parser.add_argument("--heads", type=int, default=9, help="query heads (the default model's 9, 3 KV heads, 64)")
    parser.add_argument("--kv-heads", type=int, default=3)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--output", default="results/bench_prefill_attention.jsonl")
    args = parser.parse_args()
    kernels = load_cpu_kernels()
    assert kernels is not None, "the C++ CPU kernels are not built: run `python -m runtime.execution.cpu_kernels build`"
    dtype, heads, kvh, d = getattr(torch, args.dtype), args.heads, args.kv_heads, args.head_dim
    pool_slots = 200_000  # 150 MB in bf16: beyond the last-level cache, as a server's pool is
    pool = KVPool(1, pool_slots, kvh, d, dtype, torch.device("cpu"), 1)
    gen = torch.Generator().manual_seed(0)
    pool.k[0].copy_(torch.randn(pool.k[0].shape, generator=gen))
    pool.v[0].copy_(torch.randn(pool.v[0].shape, generator=gen))
    backends = {"torch": TorchAttentionBackend(pool, heads, kvh, d),
                "kernel": TorchAttentionBackend(pool, heads, kvh, d, kernels)}
    print(f"torch threads {torch.get_num_threads()}; {args.dtype}, {heads} heads over {kvh} KV heads of {d}; "
          f"{args.slots} slots; medians of 5 rounds")
    os.makedirs(os.path.dirname(args.output) or ".", exist_ok=True)
    for case in args.cases:
        batch, new, prefix = parse_case(case)
        scattered = args.slots == "random"
        order = torch.randperm(pool_slots - 1, generator=gen) + 1 if scattered else torch.arange(pool_slots)
        meta = metadata(batch, new, prefix, order[: batch * (prefix + new)].to(torch.int64))
        q = torch.randn(batch * new, heads, d, generator=gen).to(dtype)
        times = {}
        for name, backend in backends.items():
            backend.plan(meta)
            times[name] = per_call(lambda b=backend, q=q: b._extend(0, q), args.seconds)
        row = dict(case=case, batch=batch, new=new, prefix=prefix, slots=args.slots, dtype=args.dtype,
                   kernel_us=times["kernel"] * 1e6, torch_us=times["torch"] * 1e6,
                   date=datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"))
        print(f"{case:>12}: torch {row['torch_us']:8.0f} us  kernel {row['kernel_us']:8.0f} us "
              f"({times['torch'] / times['kernel']:.2f}x)")
        with open(args.output, "a") as out:
            out.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
