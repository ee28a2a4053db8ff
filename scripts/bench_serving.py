"""Serving benchmark: an asyncio load generator for a running server (SGLang's bench_serving).

    .venv/bin/python scripts/bench_serving.py --backend openai --dataset random \\
        --random-input-len 256 --random-output-len 128 --random-range-ratio 1 \\
        --num-prompts 64 --max-concurrency 16

Backends: `openai` streams POST /v1/completions (any OpenAI-compatible server); `native` streams
POST /generate (SGLang's API). Every request is greedy with `ignore_eos`, so each output has the
asked length. Prompts are random vocabulary tokens built with the server's tokenizer
(`--tokenizer`, or the model_path from /get_model_info):
  - `random`: input lengths uniform in [len * range_ratio, len] (SGLang's rule), outputs likewise.
  - `generated-shared-prefix`: `--gsp-num-groups` random system prompts, each shared by
    `--gsp-prompts-per-group` random questions ("{system}\\n\\n{question}"), shuffled.
Prompt lengths are exact: prompts are built from "safe" tokens (a space plus letters, each its
own pre-token), so the text re-encodes to the same ids. `native` sends those `input_ids`;
`openai` sends the text (a tokenizer that adds a BOS token makes the server count one more).
Arrivals are Poisson at `--request-rate` (inf: all at once), capped by `--max-concurrency`.
Reports SGLang's numbers (throughputs; mean/median/p90/p99 of E2E latency, TTFT, TPOT and ITL)
and appends them as one JSON line to `--output-file`. Only loopback servers are accepted.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import sys
import time
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlparse

import aiohttp
import numpy as np

LOOPBACK = {"127.0.0.1", "localhost", "::1"}
SECTIONS = (("e2e_latency", "E2E Latency", "End-to-End Latency"),
            ("ttft", "TTFT", "Time to First Token"),
            ("tpot", "TPOT", "Time per Output Token (excl. 1st token)"),
            ("itl", "ITL", "Inter-Token Latency"))
SAFE_TOKEN = re.compile(r" [A-Za-z]{2,}")


@dataclass
class Prompt:
    text: str
    ids: list[int]
    output_len: int


@dataclass
class Result:
    ok: bool = False
    input_len: int = 0
    output_len: int = 0
    cached: int = 0
    ttft: float = 0.0
    latency: float = 0.0
    itl: list[float] = field(default_factory=list)
    error: str = ""


# ---------------------------------------------------------------- prompts


class PromptMaker:
    """Random prompts of exact token lengths from the tokenizer's safe tokens."""

    def __init__(self, tokenizer: Any, rng: random.Random) -> None:
        self.tok, self.rng = tokenizer, rng
        special = set(tokenizer.all_special_ids)
        ids = [i for i in range(len(tokenizer)) if i not in special]
        texts = tokenizer.batch_decode([[i] for i in ids])
        self.safe = [i for i, t in zip(ids, texts) if SAFE_TOKEN.fullmatch(t)]
        if len(self.safe) < 100:  # e.g. SentencePiece: lengths become approximate
            self.safe = ids

    def ids(self, n: int) -> list[int]:
        return [self.rng.choice(self.safe) for _ in range(n)]

    def prompt(self, parts: list[list[int]], output_len: int) -> Prompt:
        text = "\n\n".join(self.tok.decode(p) for p in parts)
        return Prompt(text, self.tok.encode(text, add_special_tokens=False), output_len)


def random_dataset(maker: PromptMaker, args: argparse.Namespace) -> list[Prompt]:
    def length(n: int) -> int:
        return maker.rng.randint(max(int(n * args.random_range_ratio), 1), n)

    return [maker.prompt([maker.ids(length(args.random_input_len))], length(args.random_output_len))
            for _ in range(args.num_prompts)]


def shared_prefix_dataset(maker: PromptMaker, args: argparse.Namespace) -> list[Prompt]:
    prompts = []
    for _ in range(args.gsp_num_groups):
        system = maker.ids(args.gsp_system_prompt_len)
        for _ in range(args.gsp_prompts_per_group):
            question = maker.ids(args.gsp_question_len)
            prompts.append(maker.prompt([system, question], args.gsp_output_len))
    maker.rng.shuffle(prompts)
    return prompts


# ---------------------------------------------------------------- requests


def request_body(args: argparse.Namespace, p: Prompt, model: str) -> tuple[str, dict[str, Any]]:
    if args.backend == "native":
        params = {"max_new_tokens": p.output_len, "temperature": 0, "ignore_eos": True}
        return "/generate", {"input_ids": p.ids, "sampling_params": params, "stream": True}
    return "/v1/completions", {
        "model": model, "prompt": p.text, "max_tokens": p.output_len, "temperature": 0,
        "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}


async def send(session: aiohttp.ClientSession, args: argparse.Namespace, p: Prompt,
               model: str) -> Result:
    """One streamed request: TTFT at the first chunk with output, ITL between such chunks."""
    path, body = request_body(args, p, model)
    result = Result(input_len=len(p.ids))
    start = last = time.perf_counter()
    try:
        async with session.post(args.base_url + path, json=body) as resp:
            if resp.status != 200:
                result.error = f"HTTP {resp.status}: {(await resp.text())[:200]}"
                return result
            async for line in resp.content:
                if not line.startswith(b"data: ") or line.strip() == b"data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                if "error" in chunk:
                    result.error = str(chunk["error"])
                    return result
                now = time.perf_counter()
                if _has_output(chunk, args.backend):
                    if result.ttft == 0.0:
                        result.ttft = now - start
                    else:
                        result.itl.append(now - last)
                    last = now
                _count(result, chunk, args.backend)
        result.latency = time.perf_counter() - start
        result.ok = result.output_len > 0
    except aiohttp.ClientError as exc:
        result.error = repr(exc)
    return result


def _has_output(chunk: dict[str, Any], backend: str) -> bool:
    if backend == "native":
        return bool(chunk.get("output_ids"))
    return any(c.get("text") for c in chunk.get("choices", []))


def _count(result: Result, chunk: dict[str, Any], backend: str) -> None:
    if backend == "native":
        meta = chunk["meta_info"]
        result.output_len, result.cached = meta["completion_tokens"], meta["cached_tokens"]
    elif chunk.get("usage"):
        usage = chunk["usage"]
        result.output_len = usage["completion_tokens"]
        result.cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0


async def run_load(args: argparse.Namespace, prompts: list[Prompt],
                   model: str) -> tuple[list[Result], float]:
    timeout = aiohttp.ClientTimeout(total=args.request_timeout)
    connector = aiohttp.TCPConnector(limit=0)
    limit = asyncio.Semaphore(args.max_concurrency or len(prompts) or 1)
    progress = Progress(len(prompts), args.disable_tqdm)
    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
        for p in prompts[: args.warmup_requests]:
            warm = await send(session, args, Prompt(p.text, p.ids, min(p.output_len, 8)), model)
            if not warm.ok:
                raise SystemExit(f"warm-up request failed: {warm.error}")

        async def one(p: Prompt) -> Result:
            async with limit:
                result = await send(session, args, p, model)
            progress.update()
            return result

        rng = np.random.default_rng(args.seed)
        tasks, start = [], time.perf_counter()
        for p in prompts:
            tasks.append(asyncio.create_task(one(p)))
            if args.request_rate != float("inf"):
                await asyncio.sleep(rng.exponential(1.0 / args.request_rate))
        results = await asyncio.gather(*tasks)
        duration = time.perf_counter() - start
    progress.close()
    return list(results), duration


class Progress:
    """tqdm when installed, else a counter line."""

    def __init__(self, total: int, disable: bool) -> None:
        self.total, self.done, self.bar = total, 0, None
        if not disable:
            try:
                from tqdm import tqdm

                self.bar = tqdm(total=total, desc="requests")
            except ImportError:
                pass
        self.disable = disable

    def update(self) -> None:
        self.done += 1
        if self.bar is not None:
            self.bar.update(1)
        elif not self.disable:
            print(f"\r{self.done}/{self.total} requests done", end="", file=sys.stderr, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
        elif not self.disable:
            print(file=sys.stderr)


# ---------------------------------------------------------------- report


def summarize(args: argparse.Namespace, results: list[Result], duration: float) -> dict[str, Any]:
    ok = [r for r in results if r.ok]
    inputs, outputs = sum(r.input_len for r in ok), sum(r.output_len for r in ok)
    ms = {
        "e2e_latency": [r.latency * 1000 for r in ok],
        "ttft": [r.ttft * 1000 for r in ok],
        "tpot": [(r.latency - r.ttft) * 1000 / (r.output_len - 1) for r in ok if r.output_len > 1],
        "itl": [x * 1000 for r in ok for x in r.itl],
    }
    report: dict[str, Any] = {
        "backend": args.backend, "dataset": args.dataset, "request_rate": args.request_rate,
        "max_concurrency": args.max_concurrency, "num_prompts": len(results),
        "completed": len(ok), "failed": len(results) - len(ok), "duration_s": duration,
        "total_input_tokens": inputs, "total_output_tokens": outputs,
        "total_cached_tokens": sum(r.cached for r in ok),
        "cache_hit_rate": sum(r.cached for r in ok) / inputs if inputs else 0.0,
        "request_throughput": len(ok) / duration, "input_throughput": inputs / duration,
        "output_throughput": outputs / duration, "total_throughput": (inputs + outputs) / duration,
        "concurrency": sum(r.latency for r in ok) / duration,
    }
    for name, values in ms.items():
        arr = np.asarray(values or [0.0])
        report.update({f"mean_{name}_ms": float(arr.mean()),
                       f"median_{name}_ms": float(np.median(arr)),
                       f"p90_{name}_ms": float(np.percentile(arr, 90)),
                       f"p99_{name}_ms": float(np.percentile(arr, 99))})
    errors = [r.error for r in results if not r.ok]
    report["first_error"] = errors[0] if errors else None
    report["args"] = {k: _plain(v) for k, v in vars(args).items() if k != "output_file"}
    report["request_rate"] = _plain(args.request_rate)
    return report


def _plain(value: Any) -> Any:
    """JSON has no infinity: an infinite rate is written as "inf"."""
    return "inf" if isinstance(value, float) and np.isinf(value) else value


def print_report(r: dict[str, Any]) -> None:
    rows = [("Backend", r["backend"]), ("Dataset", r["dataset"]),
            ("Traffic request rate", r["request_rate"]),
            ("Max request concurrency", r["max_concurrency"]),
            ("Successful requests", r["completed"]), ("Failed requests", r["failed"]),
            ("Benchmark duration (s)", f"{r['duration_s']:.2f}"),
            ("Total input tokens", r["total_input_tokens"]),
            ("Total generated tokens", r["total_output_tokens"]),
            ("Total cached tokens", r["total_cached_tokens"]),
            ("Cache hit rate (cached / input)", f"{100 * r['cache_hit_rate']:.1f}%"),
            ("Request throughput (req/s)", f"{r['request_throughput']:.2f}"),
            ("Input token throughput (tok/s)", f"{r['input_throughput']:.2f}"),
            ("Output token throughput (tok/s)", f"{r['output_throughput']:.2f}"),
            ("Total token throughput (tok/s)", f"{r['total_throughput']:.2f}"),
            ("Concurrency", f"{r['concurrency']:.2f}")]
    print(f"{' Serving Benchmark Result ':=^60}")
    for label, value in rows:
        print(f"{label + ':':<44}{value}")
    for name, short, title in SECTIONS:
        print(f"{' ' + title + ' ':-^60}")
        for stat in ("Mean", "Median", "P90", "P99"):
            label = f"{stat} {short} (ms):"
            print(f"{label:<44}{r[f'{stat.lower()}_{name}_ms']:.2f}")
    print("=" * 60)
    if r["first_error"]:
        print(f"first error: {r['first_error']}")


# ---------------------------------------------------------------- main


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--base-url", default="http://127.0.0.1:30000",
                   help="server root (loopback only)")
    p.add_argument("--backend", choices=("openai", "native"), default="openai")
    p.add_argument("--dataset", choices=("random", "generated-shared-prefix"), default="random")
    p.add_argument("--tokenizer", default=None,
                   help="tokenizer folder; default: the server's model_path")
    p.add_argument("--model", default=None,
                   help="model name for the openai backend; default: the server's")
    p.add_argument("--num-prompts", type=int, default=64, help="random dataset size")
    p.add_argument("--random-input-len", type=int, default=256)
    p.add_argument("--random-output-len", type=int, default=128)
    p.add_argument("--random-range-ratio", type=float, default=0.0,
                   help="lengths uniform in [len * ratio, len]")
    for name, default in (("num-groups", 64), ("prompts-per-group", 16),
                          ("system-prompt-len", 2048), ("question-len", 128), ("output-len", 256)):
        p.add_argument(f"--gsp-{name}", type=int, default=default)
    p.add_argument("--request-rate", type=float, default=float("inf"),
                   help="Poisson arrivals per second; inf: all at once")
    p.add_argument("--max-concurrency", type=int, default=None, help="most requests in flight")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--warmup-requests", type=int, default=1)
    p.add_argument("--request-timeout", type=float, default=3600.0)
    p.add_argument("--output-file", default="results/bench_serving.jsonl")
    p.add_argument("--disable-tqdm", action="store_true")
    args = p.parse_args(argv)
    args.base_url = args.base_url.rstrip("/")
    if urlparse(args.base_url).hostname not in LOOPBACK:
        p.error(f"--base-url must be a loopback address ({', '.join(sorted(LOOPBACK))})")
    return args


async def server_facts(args: argparse.Namespace) -> tuple[str, str]:
    """(tokenizer path, model name) from the server unless given."""
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session:
        async with session.get(args.base_url + "/get_model_info") as resp:
            info = await resp.json() if resp.status == 200 else {}
        model = args.model or info.get("served_model_name")
        if model is None:
            async with session.get(args.base_url + "/v1/models") as resp:
                model = (await resp.json())["data"][0]["id"]
    tokenizer = args.tokenizer or info.get("tokenizer_path") or info.get("model_path")
    if not tokenizer:
        raise SystemExit("no --tokenizer given and the server does not report its model_path")
    return tokenizer, model


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    tokenizer_path, model = asyncio.run(server_facts(args))
    from transformers import AutoTokenizer

    maker = PromptMaker(AutoTokenizer.from_pretrained(tokenizer_path), random.Random(args.seed))
    make = random_dataset if args.dataset == "random" else shared_prefix_dataset
    prompts = make(maker, args)
    results, duration = asyncio.run(run_load(args, prompts, model))
    report = summarize(args, results, duration)
    print_report(report)
    os.makedirs(os.path.dirname(os.path.abspath(args.output_file)), exist_ok=True)
    with open(args.output_file, "a") as fh:
        fh.write(json.dumps(report) + "\n")
    return report


if __name__ == "__main__":
    main()
