"""Accuracy and memory of GGUF files run from their blocks, against the full-precision model and
against llama.cpp's own kernels on the same files: the K-quant table of docs/benchmarks.md.

    .venv/bin/python scripts/kquant_accuracy.py                 # the files scripts/make_kquants.sh makes
    .venv/bin/python scripts/kquant_accuracy.py --files a.gguf b.gguf --prompts 8 --tokens 32

Teacher-forced, as tests/runtime/execution/test_block_quantization.py measures: the default
model's fp32 greedy answers to the chat prompts are the reference sequences. Per file:
  - drift: the mean over prompts of |mean log-prob of the reference tokens, ours - fp32's|
    (nats/token), ours being the file run from its blocks in fp32 (`--load-format gguf`), and
    llama.cpp's own drift on the same file, measured the same way;
  - top-1 against fp32: the share of answer positions where our argmax is the reference token;
  - top-1 against llama.cpp: the share where our argmax equals llama.cpp's on the same file and
    the same tokens (llama.cpp evaluates each prompt + answer with every position's logits, through
    the llama-cpp-python sources and the libraries scripts/bench_peers.sh builds under .peers/);
  - memory: the bytes our model holds (weights in blocks, the rest as loaded), and the file's size.
One JSON line per file goes to --output-file. Not part of `make test`: it needs llama.cpp built.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from kernels.linear import Linear  # noqa: E402
from runtime.execution.static_batch import StaticBatch  # noqa: E402
from runtime.support.default_model import ensure_default_model  # noqa: E402
from tests import chat_reference  # noqa: E402
from tests.runtime.execution.teacher_forcing import (  # noqa: E402
    Scored,
    drift_and_agreement,
    greedy_and_scored,
    score,
)

LLAMA = ROOT / ".peers/src/llama_cpp_python-0.3.36"
MODELS = ROOT / ".peers/models"
KW = dict(dtype="float32", max_total_tokens=4096, max_running_requests=16)


def model_bytes(engine: StaticBatch) -> int:
    """Parameters and buffers, plus the block linears' bytes (they hold no parameter)."""
    model = engine.runner.model
    held = sum(t.numel() * t.element_size() for t in [*model.parameters(), *model.buffers()])
    blocks = sum(getattr(m.method, "nbytes", 0) for m in model.modules() if isinstance(m, Linear)
                 and not m.method.full_precision)
    return held + blocks


def llama_scored(path: Path, prompts: list[list[int]], answers: list[list[int]]) -> list[Scored]:
    """llama.cpp's teacher-forced log-prob of each answer token and its own argmax there."""
    os.environ.setdefault("LLAMA_CPP_LIB_PATH", str(LLAMA / "vendor/llama.cpp/build/bin"))
    sys.path[:0] = [str(LLAMA), str(ROOT / ".peers/pydeps")]  # llama-cpp-python's sources; diskcache
    import llama_cpp

    llm = llama_cpp.Llama(str(path), logits_all=True, n_ctx=1024, n_threads=os.cpu_count(), verbose=False)
    out = []
    for prompt, answer in zip(prompts, answers, strict=True):
        llm.reset()
        llm.eval(prompt + answer[:-1])
        logits = torch.from_numpy(np.array(llm.scores[len(prompt) - 1: len(prompt) + len(answer) - 1]))
        logprobs = torch.log_softmax(logits.double(), dim=-1)
        out.append(Scored([float(logprobs[i, t]) for i, t in enumerate(answer)], logits.argmax(-1).tolist()))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--files", nargs="*", type=Path, default=sorted(MODELS.glob("*-Q[456]_K*.gguf")))
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--output-file", type=Path, default=ROOT / "results/kquant_accuracy.jsonl")
    args = parser.parse_args()
    torch.manual_seed(0)
    from transformers import AutoTokenizer

    folder = ensure_default_model()
    reference = StaticBatch.create(folder, **KW)
    prompts = chat_reference.chat_ids(AutoTokenizer.from_pretrained(folder))[: args.prompts]
    answers, bases = greedy_and_scored(reference, prompts, args.tokens)
    del reference
    args.output_file.parent.mkdir(parents=True, exist_ok=True)
    for path in args.files:
        engine = StaticBatch.create(str(path), load_format="gguf", **KW)
        ours = score(engine, prompts, answers)
        drift, agreeing = drift_and_agreement(ours, bases, answers)
        theirs = llama_scored(path, prompts, answers)
        their_drift, _ = drift_and_agreement(theirs, bases, answers)
        same = sum(a == b for o, t in zip(ours, theirs) for a, b in zip(o.argmax, t.argmax))
        positions = len(prompts) * args.tokens
        row = {"file": path.name, "date": time.strftime("%Y-%m-%d"), "prompts": len(prompts), "tokens": args.tokens,
               "drift_mean": sum(drift) / len(drift), "drift_max": max(drift),
               "llamacpp_drift_mean": sum(their_drift) / len(their_drift), "top1_vs_fp32": agreeing / positions,
               "top1_vs_llamacpp": same / positions, "model_mb": model_bytes(engine) / 1e6,
               "file_mb": path.stat().st_size / 1e6}
        print(json.dumps(row), flush=True)
        with args.output_file.open("a") as out:
            out.write(json.dumps(row) + "\n")
        del engine


if __name__ == "__main__":
    main()
