"""A decode step with its layers as one C++ call each (runtime/models/decode_stack.py) against the
same layers in Python, in one process, on the default model's Q4_1 blocks.

For each batch size: every row's own random prompt, or (`--shared N`) a cached N-token prefix
that every row shares followed by its own 128 tokens, as the radix cache hands them over. Then
`--steps` decode steps are timed per path, the paths alternated `--rounds` times on fresh rows:
- `python`: the Python layers, the baseline;
- `stack`: decode_layer per layer.
With a shared prefix of at least 512 tokens and 16 rows both attend to it once (the cascade,
kernels/csrc/cascade_attention.cpp).
Prints the median step of each round and the ratio of the best rounds; checks that both paths
chose the same tokens; appends JSON lines to `--output`.

    .venv/bin/python scripts/bench_decode_stack.py --batch-size 1 16 --shared 0 1024
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

from kernels.torch_backend import TorchAttentionBackend  # noqa: E402
from runtime.execution.device import cpu_capability  # noqa: E402
from runtime.execution.static_batch import Seq, StaticBatch  # noqa: E402
from runtime.support.default_model import gguf_path  # noqa: E402

OWN = 128  # each row's own prompt tokens after a shared prefix


def new_rows(engine: StaticBatch, batch: int, shared: list[int], seed: int) -> list[Seq]:
    """`batch` rows after one prefill step; with `shared`, its KV is the first row's, handed over."""
    gen = torch.Generator().manual_seed(seed)
    length = OWN if shared else 256
    owner = None
    if shared:
        owner = engine.new_seq(shared)
        engine.step([owner])
    seqs = []
    for _ in range(batch):
        seq = engine.new_seq(shared + torch.randint(100, 40000, (length,), generator=gen).tolist())
        if owner is not None:
            n = len(shared)
            seq.kv, seq.computed = list(owner.kv[:n]), n
            engine.runner.req_to_token.table[seq.row, :n] = torch.tensor(owner.kv[:n], dtype=torch.int32)
        seqs.append(seq)
    engine.append(seqs, engine.step(seqs))
    if owner is not None:
        seqs.append(owner)  # released with the rows; its KV is theirs too
    return seqs


def release(engine: StaticBatch, seqs: list[Seq], shared: int) -> None:
    owner = seqs.pop() if shared else None
    for seq in seqs:
        engine.allocator.free(seq.kv[shared:])
        engine.runner.req_to_token.free(seq.row)
    if owner is not None:
        engine.release([owner])


def time_steps(engine: StaticBatch, seqs: list[Seq], steps: int, rows: int) -> tuple[float, list[list[int]]]:
    """Median step in ms, and the tokens chosen."""
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        engine.append(seqs[:rows], engine.step(seqs[:rows]))
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3, [s.output[-steps:] for s in seqs[:rows]]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch-size", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--shared", type=int, nargs="+", default=[0], help="shared prefix tokens (0: none)")
    parser.add_argument("--steps", type=int, default=24)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16"],
                        help="activations (auto: the server's default for this CPU)")
    parser.add_argument("--output", default="results/bench_decode_stack.jsonl")
    args = parser.parse_args()
    most = max(args.batch_size)
    longest = max(args.shared) + max(OWN, 256) + args.steps + 8
    engine = StaticBatch.create(str(gguf_path()), load_format="gguf", dtype=args.dtype, max_running_requests=most + 1,
                                max_total_tokens=max(args.shared) + most * longest + 64, context_length=longest)
    decoder, backend = engine.runner.model.model, engine.runner.backend
    stack = decoder.decode_stack
    if stack is None or not isinstance(backend, TorchAttentionBackend):
        sys.exit("no decode stack: build the C++ kernels (make setup)")
    cap = cpu_capability()
    print(f"cpu: {cap.describe()}; threads {torch.get_num_threads()}; {engine.runner.loaded.config.dtype}")
    stamp = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    records = []
    for shared in args.shared:
        prefix = torch.randint(100, 40000, (shared,), generator=torch.Generator().manual_seed(1)).tolist()
        for batch in args.batch_size:
            ms: dict[str, list[float]] = {"python": [], "stack": []}
            chosen: dict[str, list[list[int]]] = {}
            for r in range(args.rounds):
                for path in ms:
                    decoder.decode_stack = stack if path == "stack" else None
                    seqs = new_rows(engine, batch, prefix, seed=r)
                    step_ms, chosen[path] = time_steps(engine, seqs, args.steps, batch)
                    ms[path].append(step_ms)
                    release(engine, seqs, shared)
            decoder.decode_stack = stack
            best = {path: min(v) for path, v in ms.items()}
            rounds = "  ".join(f"{p} {' '.join(f'{t:.1f}' for t in v)}" for p, v in ms.items())
            print(f"B={batch:3d} shared {shared:5d}: python {best['python']:6.2f} ms, stack {best['stack']:6.2f} ms "
                  f"({best['python'] / best['stack']:.2f}x; same tokens: {chosen['python'] == chosen['stack']}) "
                  f"[rounds: {rounds}]", flush=True)
            records.append({"time": stamp, "cpu": cap.describe(), "batch": batch, "shared": shared,
                            "steps": args.steps, "ms": ms, "same_tokens": chosen["python"] == chosen["stack"]})
    os.makedirs(os.path.dirname(args.output) or ".", exist_ok=True)
    with open(args.output, "a") as out:
        for record in records:
            out.write(json.dumps(record) + "\n")


if __name__ == "__main__":
    main()
