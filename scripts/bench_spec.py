"""N-gram speculative decoding against plain decoding, in one run, through the in-process Engine.

Two workloads, greedy, `--output-len` tokens each (EOS ignored, so both modes make the same
tokens): "repetitive" (code editing: the answer repeats large parts of the prompt; the model is
asked to copy a file with one change) and "random" (prompts of random tokens), at batch 1 and
16. Prints per run the tokens per forward, the accept length (tokens per verify step), the
decode time per output token and its ratio against plain decoding; writes JSON lines to
results/bench_spec.jsonl.

    .venv/bin/python scripts/bench_spec.py --output-len 128
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import random
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from runtime import Engine  # noqa: E402

CODE = '''def load(path):
    with open(path) as fh:
        rows = [line.strip().split(",") for line in fh]
    return [row for row in rows if row and row[0]]


def total(rows, column):
    value = 0
    for row in rows:
        value += float(row[column])
    return value
'''


def repetitive_prompts(n: int) -> list[str]:
    return [f"Here is a Python file:\n\n{CODE.replace('rows', f'rows{i}')}\nRewrite the file with the function "
            f"`total` renamed to `sum_column`. Output the whole file.\n\n" for i in range(n)]


def random_prompts(n: int, vocab: int, length: int = 64) -> list[list[int]]:
    rng = random.Random(0)
    return [[rng.randrange(100, vocab) for _ in range(length)] for _ in range(n)]


def measure(engine: Engine, prompts: list, output_len: int) -> dict[str, float]:
    params = {"temperature": 0, "max_new_tokens": output_len, "ignore_eos": True}
    key = "input_ids" if isinstance(prompts[0], list) else "prompt"
    engine.generate(**{key: prompts[:1]}, sampling_params={**params, "max_new_tokens": 4})  # warm-up
    before = engine.get_state()
    start = time.perf_counter()
    outs = engine.generate(**{key: prompts}, sampling_params=params)
    seconds = time.perf_counter() - start
    after = engine.get_state()
    tokens = sum(o["meta_info"]["completion_tokens"] for o in outs)
    forwards = after["forward_count"] - before["forward_count"]
    steps = after["spec_verify_steps"] - before["spec_verify_steps"]
    accepted = after["spec_accepted"] - before["spec_accepted"]
    return {"tokens": tokens, "seconds": seconds, "tokens_per_forward": tokens / max(forwards, 1),
            "accept_length": (accepted + steps) / steps if steps else 0.0,
            "time_per_output_token_ms": 1000 * seconds / (tokens / len(prompts)),
            "ids": [o["output_ids"] for o in outs]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--output-len", type=int, default=128)
    p.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 4, 16])
    p.add_argument("--num-draft-tokens", type=int, default=4)
    p.add_argument("--disable-by-batch-size", type=int, default=1024,
                   help="--speculative-disable-by-batch-size (default here: never, to measure every batch size)")
    p.add_argument("--dtype", default="auto")
    p.add_argument("--output", default="results/bench_spec.jsonl")
    args = p.parse_args()
    runs: dict[tuple[str, str, int], dict] = {}
    for mode in ("plain", "ngram"):
        spec = {"speculative_algorithm": "ngram", "speculative_num_draft_tokens": args.num_draft_tokens,
                "speculative_disable_by_batch_size": args.disable_by_batch_size} if mode == "ngram" else {}
        with Engine(dtype=args.dtype, **spec) as engine:
            vocab = engine.tokenizer_manager.scheduler_info["vocab_size"]
            for workload in ("repetitive", "random"):
                for bs in args.batch_sizes:
                    prompts = repetitive_prompts(bs) if workload == "repetitive" else random_prompts(bs, vocab)
                    runs[(mode, workload, bs)] = measure(engine, prompts, args.output_len)
    stamp = datetime.datetime.now().isoformat(timespec="seconds")
    os.makedirs(os.path.dirname(args.output) or ".", exist_ok=True)
    print(f"{'workload':12}{'batch':>6}{'tok/forward':>13}{'accept len':>12}{'TPOT plain':>12}{'TPOT ngram':>12}"
          f"{'ratio':>8}{'same ids':>10}")
    with open(args.output, "a") as fh:
        for workload in ("repetitive", "random"):
            for bs in args.batch_sizes:
                plain, spec = runs[("plain", workload, bs)], runs[("ngram", workload, bs)]
                ratio = spec["time_per_output_token_ms"] / plain["time_per_output_token_ms"]
                same = plain["ids"] == spec["ids"]
                print(f"{workload:12}{bs:6d}{spec['tokens_per_forward']:13.2f}{spec['accept_length']:12.2f}"
                      f"{plain['time_per_output_token_ms']:12.1f}{spec['time_per_output_token_ms']:12.1f}"
                      f"{ratio:8.2f}{str(same):>10}")
                row = {"date": stamp, "workload": workload, "batch_size": bs, "output_len": args.output_len,
                       "num_draft_tokens": args.num_draft_tokens, "tpot_ratio": ratio, "same_ids": same,
                       **{f"plain_{k}": v for k, v in plain.items() if k != "ids"},
                       **{f"ngram_{k}": v for k, v in spec.items() if k != "ids"}}
                fh.write(json.dumps(row) + "\n")
    print(f"results: {args.output}")


if __name__ == "__main__":
    main()
