"""Offline throughput through the Engine (all prompts submitted at once), against baselines
measured in the same run.

    mixed:          N prompts of random lengths; radixserve (continuous batching) against Hugging
                    Face `generate` in static batches of --hf-batch-size (left padded, each batch
                    runs to its longest requested output; only requested tokens count).
    shared-prefix:  groups of prompts sharing a long system prompt (SGLang's generated-shared-
                    prefix, scaled down); radixserve with the radix cache on against off.
    overlap:        a static decode-heavy batch at each --overlap-batch-sizes, overlap loop on
                    against off; also the scheduler overhead: the share of the scheduler's busy
                    time not spent inside the model forward (1 - forward_s / busy_s).

Prompts are random token ids (exact lengths); every request generates exactly its output length
(ignore_eos). Prints a table with the ratio and appends JSON lines to --output.

    .venv/bin/python scripts/bench_offline.py --workload mixed --num-prompts 64
    .venv/bin/python scripts/bench_offline.py --workload shared-prefix --gsp-groups 4 --gsp-prompts-per-group 8
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import random
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@dataclass
class Workload:
    prompts: list[list[int]]
    output_lens: list[int]

    @property
    def output_tokens(self) -> int:
        return sum(self.output_lens)


def mixed_workload(args: argparse.Namespace, vocab: int) -> Workload:
    rng = random.Random(args.seed)
    prompts = [[rng.randrange(100, vocab) for _ in range(rng.randint(args.min_input, args.max_input))]
               for _ in range(args.num_prompts)]
    outputs = [rng.randint(args.min_output, args.max_output) for _ in range(args.num_prompts)]
    return Workload(prompts, outputs)


def shared_prefix_workload(args: argparse.Namespace, vocab: int) -> Workload:
    rng = random.Random(args.seed)
    tok = lambda n: [rng.randrange(100, vocab) for _ in range(n)]  # noqa: E731
    prompts = []
    for _ in range(args.gsp_groups):
        system = tok(args.gsp_system_len)
        prompts += [system + tok(args.gsp_question_len) for _ in range(args.gsp_prompts_per_group)]
    rng.shuffle(prompts)
    return Workload(prompts, [args.gsp_output_len] * len(prompts))


def run_engine(model_path: str, work: Workload, dtype: str, **config: Any) -> float:
    """Seconds for the Engine to finish the whole workload (model load excluded)."""
    return run_engine_stats(model_path, work, dtype, **config)[0]


def run_engine_stats(model_path: str, work: Workload, dtype: str, **config: Any) -> tuple[float, float]:
    """(seconds for the whole workload, share of scheduler busy time outside the forward)."""
    from runtime import Engine

    with Engine(model_path, dtype=dtype, **config) as engine:
        engine.generate(input_ids=[[101, 102, 103]], sampling_params={"max_new_tokens": 2})  # warm-up
        params = [{"temperature": 0, "max_new_tokens": n, "ignore_eos": True} for n in work.output_lens]
        before = engine.get_state()
        start = time.perf_counter()
        results = engine.generate(input_ids=work.prompts, sampling_params=params)
        elapsed = time.perf_counter() - start
        after = engine.get_state()
    produced = sum(r["meta_info"]["completion_tokens"] for r in results)
    assert produced == work.output_tokens, (produced, work.output_tokens)
    busy = after["busy_s"] - before["busy_s"]
    forward = after["forward_s"] - before["forward_s"]
    return elapsed, max(busy - forward, 0.0) / busy


def run_hf(model_path: str, work: Workload, dtype: str, batch_size: int) -> float:
    """Seconds for HF `generate` over static batches of `batch_size` (left padded)."""
    import torch
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(model_path, dtype=getattr(torch, dtype)).eval()
    order = list(range(len(work.prompts)))
    start = time.perf_counter()
    for i in range(0, len(order), batch_size):
        idx = order[i : i + batch_size]
        width = max(len(work.prompts[j]) for j in idx)
        ids = torch.zeros((len(idx), width), dtype=torch.long)
        mask = torch.zeros_like(ids)
        for row, j in enumerate(idx):
            p = work.prompts[j]
            ids[row, width - len(p) :] = torch.tensor(p)
            mask[row, width - len(p) :] = 1
        steps = max(work.output_lens[j] for j in idx)
        with torch.inference_mode():
            model.generate(ids, attention_mask=mask, max_new_tokens=steps, min_new_tokens=steps,
                           do_sample=False, pad_token_id=0)
    return time.perf_counter() - start


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model-path", default=None)
    p.add_argument("--workload", choices=["mixed", "shared-prefix", "overlap"], default="mixed")
    p.add_argument("--overlap-batch-sizes", type=int, nargs="+", default=[1, 32])
    p.add_argument("--overlap-input-len", type=int, default=128)
    p.add_argument("--overlap-output-len", type=int, default=128)
    p.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16"])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--num-prompts", type=int, default=64)
    p.add_argument("--min-input", type=int, default=16)
    p.add_argument("--max-input", type=int, default=512)
    p.add_argument("--min-output", type=int, default=16)
    p.add_argument("--max-output", type=int, default=128)
    p.add_argument("--hf-batch-size", type=int, default=16)
    p.add_argument("--gsp-groups", type=int, default=4)
    p.add_argument("--gsp-prompts-per-group", type=int, default=8)
    p.add_argument("--gsp-system-len", type=int, default=1024)
    p.add_argument("--gsp-question-len", type=int, default=64)
    p.add_argument("--gsp-output-len", type=int, default=16)
    p.add_argument("--max-running-requests", type=int, default=64)
    p.add_argument("--output", default="results/bench_offline.jsonl")
    args = p.parse_args()

    model_path = args.model_path
    if model_path is None:
        from runtime.support.default_model import ensure_default_model

        model_path = ensure_default_model()
    vocab = 49152 if args.model_path is None else json.loads(Path(model_path, "config.json").read_text())["vocab_size"]
    common = dict(max_running_requests=args.max_running_requests, max_total_tokens=131072)
    if args.workload == "overlap":
        return bench_overlap(args, model_path, vocab, common)
    if args.workload == "mixed":
        work = mixed_workload(args, vocab)
        ours = run_engine(model_path, work, args.dtype, **common)
        base = run_hf(model_path, work, args.dtype, args.hf_batch_size)
        names = ("radixserve", f"HF generate (static batches of {args.hf_batch_size})")
    else:
        work = shared_prefix_workload(args, vocab)
        ours = run_engine(model_path, work, args.dtype, **common)
        base = run_engine(model_path, work, args.dtype, disable_radix_cache=True, **common)
        names = ("radix cache on", "radix cache off")

    tokens = work.output_tokens
    print(f"workload {args.workload}: {len(work.prompts)} prompts, "
          f"{sum(map(len, work.prompts))} input tokens, {tokens} output tokens, {args.dtype}")
    print(f"{'engine':<40} | {'seconds':>8} | {'output tok/s':>12}")
    print(f"{names[0]:<40} | {ours:>8.2f} | {tokens / ours:>12.1f}")
    print(f"{names[1]:<40} | {base:>8.2f} | {tokens / base:>12.1f}")
    print(f"ratio: {base / ours:.2f}x")
    row = dict(bench="offline", workload=args.workload, date=datetime.datetime.now().isoformat(timespec="seconds"),
               dtype=args.dtype, prompts=len(work.prompts), output_tokens=tokens, ours_s=ours, baseline_s=base,
               baseline=names[1], ratio=base / ours, args=vars(args))
    os.makedirs(os.path.dirname(args.output) or ".", exist_ok=True)
    with open(args.output, "a") as fh:
        fh.write(json.dumps(row) + "\n")


def bench_overlap(args: argparse.Namespace, model_path: str, vocab: int, common: dict[str, Any]) -> None:
    rng = random.Random(args.seed)
    print(f"{'batch':>5} | {'overlap':>7} | {'seconds':>8} | {'output tok/s':>12} | {'sched overhead':>14}")
    rows = []
    for batch in args.overlap_batch_sizes:
        prompts = [[rng.randrange(100, vocab) for _ in range(args.overlap_input_len)] for _ in range(batch)]
        work = Workload(prompts, [args.overlap_output_len] * batch)
        for overlap in (True, False):
            secs, share = run_engine_stats(model_path, work, args.dtype, disable_overlap_schedule=not overlap, **common)
            print(f"{batch:>5} | {'on' if overlap else 'off':>7} | {secs:>8.2f} | "
                  f"{work.output_tokens / secs:>12.1f} | {share * 100:>13.1f}%")
            rows.append(dict(bench="offline", workload="overlap", batch_size=batch, overlap=overlap, seconds=secs,
                             output_tok_s=work.output_tokens / secs, sched_overhead_share=share, dtype=args.dtype,
                             date=datetime.datetime.now().isoformat(timespec="seconds")))
    os.makedirs(os.path.dirname(args.output) or ".", exist_ok=True)
    with open(args.output, "a") as fh:
        fh.writelines(json.dumps(r) + "\n" for r in rows)


if __name__ == "__main__":
    main()
