"""Static-batch latency: our model runner against Hugging Face `generate`, in the same run.

For each batch size, both engines get the same random prompts (fixed seed) and generate exactly
`--output-len` tokens greedily. Prints prefill seconds, decode tokens/s and the decode ratio, and
appends one JSON line per batch size to `--output` for plots.

    .venv/bin/python scripts/bench_one_batch.py --batch-size 1 8 32 --input-len 128 --output-len 64 --dtype bfloat16
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from runtime.execution.static_batch import StaticBatch  # noqa: E402


def random_prompts(batch: int, length: int, vocab: int, seed: int) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)
    # Skip the low ids, where the special tokens of most vocabularies live.
    return torch.randint(100, vocab, (batch, length), generator=gen).tolist()


def bench_ours(engine: StaticBatch, prompts: list[list[int]], output_len: int) -> tuple[float, float]:
    """(prefill seconds, decode tokens/s) for one static batch."""
    seqs = [engine.new_seq(p) for p in prompts]
    t0 = time.perf_counter()
    engine.append(seqs, engine.step(seqs))
    t1 = time.perf_counter()
    for _ in range(output_len - 1):
        engine.append(seqs, engine.step(seqs))
    t2 = time.perf_counter()
    engine.release(seqs)
    return t1 - t0, len(prompts) * (output_len - 1) / (t2 - t1)


def bench_hf(model: torch.nn.Module, prompts: list[list[int]], output_len: int, pad_id: int) -> tuple[float, float]:
    ids = torch.tensor(prompts)
    kw = dict(do_sample=False, pad_token_id=pad_id, attention_mask=torch.ones_like(ids))
    with torch.inference_mode():
        t0 = time.perf_counter()
        model.generate(ids, max_new_tokens=1, min_new_tokens=1, **kw)
        t1 = time.perf_counter()
        model.generate(ids, max_new_tokens=output_len, min_new_tokens=output_len, **kw)
        t2 = time.perf_counter()
    prefill = t1 - t0
    return prefill, len(prompts) * (output_len - 1) / max(t2 - t1 - prefill, 1e-9)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model-path", default=None, help="HF folder; default: the embedded SmolLM2-135M-Instruct")
    parser.add_argument("--load-format", default="auto", choices=["auto", "gguf", "dummy"],
                        help="gguf: run a .gguf's blocks (default: the embedded model's Q4_1 file); implies --skip-hf")
    parser.add_argument("--batch-size", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--input-len", type=int, default=128)
    parser.add_argument("--output-len", type=int, default=64)
    parser.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16"],
                        help="auto: the server's default for this CPU")
    parser.add_argument("--quantization", default="none", choices=["none", "int8", "q8_0", "q4_0", "q4_1"])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--skip-hf", action="store_true", help="only measure radixserve")
    parser.add_argument("--output", default="results/bench_one_batch.jsonl")
    args = parser.parse_args()

    model_path = args.model_path
    if model_path is None and args.load_format == "gguf":
        from runtime.support.default_model import gguf_path

        model_path = str(gguf_path())
    elif model_path is None:
        from runtime.support.default_model import ensure_default_model

        model_path = ensure_default_model()
    args.skip_hf = args.skip_hf or args.load_format == "gguf"
    max_batch = max(*args.batch_size, 2)  # the warm-up runs 2 rows
    tokens = max_batch * (args.input_len + args.output_len + 16)
    ours = StaticBatch.create(
        model_path, dtype=args.dtype, load_format=args.load_format, max_total_tokens=tokens,
        quantization=args.quantization, max_running_requests=max_batch,
        context_length=args.input_len + args.output_len + 16,
    )
    vocab = ours.runner.vocab_size
    args.dtype = ours.runner.loaded.config.dtype  # "auto" resolved, for HF and the results
    hf = None
    if not args.skip_hf:
        import transformers

        hf = transformers.AutoModelForCausalLM.from_pretrained(model_path, dtype=getattr(torch, args.dtype)).eval()

    # Warm up both (first-call allocations, oneDNN primitive caches).
    warm = random_prompts(2, 16, vocab, args.seed + 1)
    bench_ours(ours, warm, 4)
    if hf is not None:
        bench_hf(hf, warm, 4, pad_id=0)

    rows = []
    header = (f"{'batch':>5} | {'ours prefill s':>14} | {'ours decode tok/s':>17} | {'HF prefill s':>12} | "
              f"{'HF decode tok/s':>15} | {'decode ratio':>12}")
    print(header)
    print("-" * len(header))
    for batch in args.batch_size:
        prompts = random_prompts(batch, args.input_len, vocab, args.seed)
        o_prefill, o_decode = bench_ours(ours, prompts, args.output_len)
        nan = float("nan")
        h_prefill, h_decode = bench_hf(hf, prompts, args.output_len, pad_id=0) if hf is not None else (nan, nan)
        ratio = o_decode / h_decode if hf is not None else float("nan")
        print(f"{batch:>5} | {o_prefill:>14.3f} | {o_decode:>17.1f} | {h_prefill:>12.3f} | {h_decode:>15.1f} | "
              f"{ratio:>12.2f}")
        rows.append(dict(
            bench="one_batch", date=datetime.datetime.now().isoformat(timespec="seconds"), batch_size=batch,
            input_len=args.input_len, output_len=args.output_len, dtype=args.dtype, quantization=args.quantization,
            model=os.path.basename(model_path),
            ours_prefill_s=o_prefill, ours_decode_tok_s=o_decode, hf_prefill_s=h_prefill, hf_decode_tok_s=h_decode,
            decode_ratio=ratio, threads=torch.get_num_threads(),
        ))
    os.makedirs(os.path.dirname(args.output) or ".", exist_ok=True)
    with open(args.output, "a") as fh:
        for row in rows:
            fh.write(json.dumps(row) + "\n")
    print(f"results appended to {args.output}")


if __name__ == "__main__":
    main()
