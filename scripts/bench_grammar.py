"""Costs of grammar-constrained decoding on this machine (xgrammar, default-model tokenizer).

    compile:  a typical JSON schema (6 fields: nested object, array, enum) through
              `GrammarBackend.submit(spec).result()`, cold (a distinct schema each time) and
              cached; also the builtin JSON grammar, a regex, and validation in the tokenizer
              process (`GrammarChecker.validate`, cold and cached).
    step:     one decode step's grammar work at batch 1 and 16: fill the bitmask of every row,
              apply it to fp32 logits [B, 49152], argmax, accept the tokens (rows teacher-forced
              through a real answer, so the masks are the real mix); against an unconstrained
              step's argmax. `apply` is `apply_token_bitmask` (the sparse/dense dispatch);
              `apply_xgr` (xgrammar's CPU kernel on every row) and `apply_torch` (the plain torch
              version) run on the same masks for comparison.
    gil:      the longest stall of a 1 ms ticking Python thread while another thread builds or
              compiles a schema (does it block the scheduler thread?), against a plain sleep.

Prints a table and appends JSON lines to --output.

    .venv/bin/python scripts/bench_grammar.py
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from kernels import grammar_mask  # noqa: E402
from kernels.grammar_mask import apply_token_bitmask, apply_token_bitmask_torch  # noqa: E402
from runtime.support.grammar_check import GrammarChecker, GrammarSpec  # noqa: E402
from scheduler.grammar import GrammarBackend, allocate_bitmask  # noqa: E402

VOCAB = 49152
EOS = 2


def typical_schema(tag: int = 0) -> str:
    """An object with 6 fields incl. a nested object, an array and an enum; `tag` makes it a
    distinct cache key without changing its shape."""
    return json.dumps({
        "title": f"Person{tag}",
        "type": "object",
        "properties": {
            "name": {"type": "string"},
            "age": {"type": "integer", "minimum": 0},
            "email": {"type": "string", "format": "email"},
            "role": {"enum": ["admin", "user", "guest"]},
            "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 5},
            "address": {
                "type": "object",
                "properties": {"city": {"type": "string"}, "zip": {"type": "string"}},
                "required": ["city"],
            },
        },
        "required": ["name", "age", "role"],
    })


def ms(fn: Callable[[], Any], repeat: int) -> float:
    """Median wall time of `fn` in milliseconds."""
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times)


def bench_compile(backend: GrammarBackend, repeat: int) -> dict[str, float]:
    counter = iter(range(1, 1 << 30))
    cold = ms(lambda: backend.submit(GrammarSpec("json", typical_schema(next(counter)))).result(),
              repeat)
    spec = GrammarSpec("json", typical_schema())
    backend.submit(spec).result()
    cached = ms(lambda: backend.submit(spec).result(), 1000)
    regex = ms(lambda: backend.submit(GrammarSpec("regex", rf"\d{{{next(counter)}}}")).result(),
               repeat)
    backend.reset()
    any_json = ms(lambda: (backend.reset(), backend.submit(GrammarSpec("json_object", "$$ANY$$"))
                           .result()), repeat)
    return dict(compile_json_cold_ms=cold, compile_json_cached_ms=cached,
                compile_regex_cold_ms=regex, compile_any_json_ms=any_json)


def bench_validate(repeat: int) -> dict[str, float]:
    checker = GrammarChecker()
    try:
        t = time.perf_counter()
        checker.start()
        start = (time.perf_counter() - t) * 1e3
        counter = iter(range(1, 1 << 30))
        cold = ms(lambda: checker.validate(GrammarSpec("json", typical_schema(next(counter)))),
                  repeat)
        spec = GrammarSpec("json", typical_schema())
        checker.validate(spec)
        cached = ms(lambda: checker.validate(spec), 1000)
    finally:
        checker.close()
    return dict(validate_worker_start_ms=start, validate_json_ms=cold,
                validate_json_cached_ms=cached)


SAMPLE = {"name": "Alice Johnson", "age": 34, "email": "alice.johnson@example.com",
          "role": "admin", "tags": ["engineering", "on-call"],
          "address": {"city": "Lisbon", "zip": "1100-148"}}


def bench_step(backend: GrammarBackend, tok: Any, batch: int, steps: int) -> dict[str, float]:
    """Per-step grammar work for `batch` constrained rows. Each row is teacher-forced through a
    real answer to the typical schema (rows start at different offsets, and restart when done),
    so the masks are the real mix of structure (sparse) and string content (dense); logits are
    random. Both apply versions run on the same masks; `apply` (the dispatch) is the one timed
    into the step."""
    compiled = backend.submit(GrammarSpec("json", typical_schema())).result()
    answer = tok.encode(json.dumps(SAMPLE), add_special_tokens=False) + [EOS]
    states, offsets = [backend.new_state(compiled) for _ in range(batch)], [0] * batch
    for i in range(batch):  # stagger the rows along the answer
        for t in answer[: (i * 7) % (len(answer) - 1)]:
            assert states[i].accept(t)
            offsets[i] += 1
    bitmask = allocate_bitmask(batch, VOCAB)
    rows = list(range(batch))
    gen = torch.Generator().manual_seed(0)
    parts = dict.fromkeys(("fill", "apply", "apply_xgr", "apply_torch", "argmax", "accept"), 0.0)
    xgr_kernel = grammar_mask._xgrammar_cpu_kernel()
    sparse_rows = 0
    for _ in range(steps):
        logits = torch.randn(batch, VOCAB, generator=gen)
        spares = logits.clone(), logits.clone()
        t0 = time.perf_counter()
        for i, s in enumerate(states):
            s.fill_mask(bitmask, i)
        t1 = time.perf_counter()
        apply_token_bitmask(logits, bitmask, rows)
        t2 = time.perf_counter()
        if xgr_kernel is not None:
            xgr_kernel(spares[0], bitmask, VOCAB, rows)
        t3 = time.perf_counter()
        apply_token_bitmask_torch(spares[1], bitmask, rows)
        t4 = time.perf_counter()
        logits.argmax(dim=-1).tolist()
        t5 = time.perf_counter()
        for i, s in enumerate(states):
            assert s.accept(answer[offsets[i]])
            offsets[i] += 1
            if s.is_terminated():
                states[i], offsets[i] = backend.new_state(compiled), 0
        t6 = time.perf_counter()
        sparse_rows += len(grammar_mask._split_sparse(bitmask, rows)[0])
        for key, dt in zip(parts, (t1 - t0, t2 - t1, t3 - t2, t4 - t3, t5 - t4, t6 - t5)):
            parts[key] += dt * 1e3 / steps
    plain = torch.randn(batch, VOCAB, generator=gen)
    base = ms(lambda: plain.argmax(dim=-1).tolist(), steps)
    total = parts["fill"] + parts["apply"] + parts["argmax"] + parts["accept"]
    return dict(batch=batch, **{f"{k}_ms": v for k, v in parts.items()},
                constrained_step_ms=total, unconstrained_argmax_ms=base,
                grammar_overhead_ms=total - base, sparse_row_share=sparse_rows / (steps * batch))


def max_stall_ms(work: Callable[[], Any]) -> tuple[float, float]:
    """(work seconds, longest gap in ms of a thread ticking every 1 ms while `work` runs)."""
    done = threading.Event()
    gaps: list[float] = []

    def ticker() -> None:
        last = time.perf_counter()
        while not done.is_set():
            time.sleep(0.001)
            now = time.perf_counter()
            gaps.append(now - last)
            last = now

    thread = threading.Thread(target=ticker)
    thread.start()
    time.sleep(0.02)
    t = time.perf_counter()
    work()
    secs = time.perf_counter() - t
    done.set()
    thread.join()
    return secs, max(gaps) * 1e3


def bench_gil(backend: GrammarBackend) -> dict[str, float]:
    import xgrammar as xgr

    deep = '{"type": "array", "items": ' * 100 + '{"type": "integer"}' + "}" * 100
    _, sleep_stall = max_stall_ms(lambda: time.sleep(0.15))
    build_s, build_stall = max_stall_ms(lambda: xgr.Grammar.from_json_schema(deep))
    spec = GrammarSpec("json", typical_schema(-1))
    compile_s, compile_stall = max_stall_ms(lambda: backend._compile(spec))
    return dict(gil_sleep_max_stall_ms=sleep_stall, gil_build_deep_schema_ms=build_s * 1e3,
                gil_build_max_stall_ms=build_stall, gil_compile_ms=compile_s * 1e3,
                gil_compile_max_stall_ms=compile_stall)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model-path", default=None, help="tokenizer folder (default: default model)")
    p.add_argument("--repeat", type=int, default=10, help="cold compiles / validations timed")
    p.add_argument("--steps", type=int, default=200, help="decode steps timed per batch size")
    p.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 16])
    p.add_argument("--threads", type=int, default=2, help="torch threads (the machine's cores)")
    p.add_argument("--output", default="results/bench_grammar.jsonl")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    import transformers

    from runtime.support.default_model import ensure_default_model

    tok = transformers.AutoTokenizer.from_pretrained(args.model_path or ensure_default_model())
    t = time.perf_counter()
    backend = GrammarBackend(tok, VOCAB, stop_token_ids=[EOS])
    setup_ms = (time.perf_counter() - t) * 1e3
    fixed = dict(backend_init_ms=setup_ms, **bench_compile(backend, args.repeat),
                 **bench_validate(args.repeat), **bench_gil(backend))
    steps = [bench_step(backend, tok, b, args.steps) for b in args.batch_sizes]
    backend.shutdown()
    print_table(fixed, steps)
    date = datetime.datetime.now().isoformat(timespec="seconds")
    os.makedirs(os.path.dirname(args.output) or ".", exist_ok=True)
    with open(args.output, "a") as fh:
        common = dict(bench="grammar", date=date, threads=args.threads)
        fh.write(json.dumps(dict(common, part="fixed", **fixed)) + "\n")
        fh.writelines(json.dumps(dict(common, part="step", **s)) + "\n" for s in steps)


def print_table(fixed: dict[str, float], steps: list[dict[str, float]]) -> None:
    print(f"{'measure':<32} | {'ms':>9}")
    for key, value in fixed.items():
        print(f"{key.removesuffix('_ms'):<32} | {value:>9.3f}")
    cols = ["fill", "apply", "apply_xgr", "apply_torch", "argmax", "accept", "constrained_step",
            "unconstrained_argmax", "grammar_overhead"]
    print()
    print("per decode step, ms: " + " | ".join(["batch"] + cols + ["sparse row share"]))
    for s in steps:
        cells = [f"{int(s['batch']):>5}"] + [f"{s[c + '_ms']:.3f}" for c in cols]
        print(" | ".join(cells + [f"{s['sparse_row_share']:.2f}"]))


if __name__ == "__main__":
    main()
