"""The prepared device check: FlashInfer against the torch backend, CUDA graphs against eager, and
decode speed, on dummy weights of real model shapes. Run by scripts/gpu_check.sh.

    python scripts/gpu_check.py OUT_DIR            # on a CUDA GPU
    python scripts/gpu_check.py OUT_DIR --dry-run  # on CPU: the same code path on tiny shapes,
                                                   # FlashInfer replaced by tests/kernels/fake_flashinfer

Every result is appended to OUT_DIR/results.jsonl as soon as it exists (a run cut short still
reports what it did), and a summary goes to OUT_DIR/summary.txt at the end. The exit status is 1
when any comparison failed.

The shapes keep the real attention layout (heads, KV heads, head dim, vocabulary) with fewer
layers, so FlashInfer's kernels and their dispatch are the real ones while weights stay small.
Dummy weights give flat logits: logits are compared, not tokens, between backends; CUDA graphs
against eager compare greedy tokens too (the same kernels, so they must agree), and count the
replays (every decode step must go through a graph: on CPU, its eager stand-in). Decode speed is
recorded as "info": a measurement, neither ok nor failed.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from tests.kernels.backend_scenarios import SCENARIOS, max_logit_error, run_scenario  # noqa: E402
from tests.runtime.execution.tiny_runner import with_flashinfer_backend, write_config  # noqa: E402

# name: (heads, kv heads, head dim, hidden, intermediate, vocab); layers cut to LAYERS.
REAL_SHAPES = {
    "llama-3.2-1b": (32, 8, 64, 2048, 8192, 128256),
    "qwen2.5-7b-group7": (28, 4, 128, 3584, 18944, 152064),
}
TINY_SHAPES = {"llama-3.2-1b": (32, 8, 64, 128, 256, 512), "qwen2.5-7b-group7": (14, 2, 64, 128, 256, 512)}
LAYERS = 4
BF16_LOGIT_TOLERANCE = 0.05  # max |difference| of logits (dummy weights give logits of order 1)
GRAPH_LOGIT_TOLERANCE = 1e-4  # fp32 dry run: the stand-in replay reruns the same ops on a padded batch
DECODE_BATCHES = (1, 32, 128, 256)


class Report:
    """results.jsonl records: {"kind", "status": "ok" | "FAIL" | "info", "ok": bool | None, ...}.
    A measurement without a pass/fail criterion (decode speed) is "info" (ok None), never "ok"."""

    def __init__(self, out: Path) -> None:
        self.out = out
        out.mkdir(parents=True, exist_ok=True)
        self.path = out / "results.jsonl"
        self.path.write_text("")
        self.failed: list[str] = []
        self.lines: list[str] = []

    def add(self, kind: str, ok: bool, **fields: Any) -> None:
        self._write(kind, "ok" if ok else "FAIL", ok, fields)

    def info(self, kind: str, **fields: Any) -> None:
        self._write(kind, "info", None, fields)

    def _write(self, kind: str, status: str, ok: bool | None, fields: dict[str, Any]) -> None:
        record = {"kind": kind, "status": status, "ok": ok, **fields}
        with self.path.open("a") as fh:
            fh.write(json.dumps(record) + "\n")
        line = f"{status:4} {kind} " + " ".join(f"{k}={v}" for k, v in fields.items())
        print(line, flush=True)
        self.lines.append(line)
        if status == "FAIL":
            self.failed.append(line)

    def finish(self) -> int:
        (self.out / "summary.txt").write_text("\n".join(self.lines) + f"\n{len(self.failed)} failed\n")
        return 1 if self.failed else 0


def model_folder(root: Path, name: str, dry_run: bool) -> str:
    heads, kv_heads, head_dim, hidden, inter, vocab = (TINY_SHAPES if dry_run else REAL_SHAPES)[name]
    path = write_config(root / name, heads, kv_heads, head_dim, layers=2 if dry_run else LAYERS, vocab=vocab)
    config = json.loads(Path(path, "config.json").read_text())
    config.update(hidden_size=hidden, intermediate_size=inter, max_position_embeddings=4096)
    Path(path, "config.json").write_text(json.dumps(config))
    return path


def make_runner(path: str, backend: str, page_size: int, dry_run: bool, max_running: int = 16, kv_tokens: int = 8192):
    """A runner on the GPU (or on CPU in a dry run, "flashinfer" then being the stand-in)."""
    from runtime.contracts.config import ServerConfig
    from runtime.execution.model_runner import ModelRunner
    from runtime.execution.model_setup import load_model_for_serving
    from runtime.execution.resolve import resolve_config

    device = "cpu" if dry_run else "cuda"
    dtype = "float32" if dry_run else "bfloat16"
    asked = "torch" if dry_run else backend
    cfg = resolve_config(ServerConfig(
        model_path=path, device=device, load_format="dummy", dtype=dtype, page_size=page_size, attention_backend=asked,
        max_total_tokens=kv_tokens, max_running_requests=max_running, context_length=2048, disable_cuda_graph=True,
    ))
    loaded = load_model_for_serving(cfg)
    if dry_run and backend == "flashinfer":
        loaded = with_flashinfer_backend(loaded)
    runner = ModelRunner(loaded)
    runner.warmup()
    return runner


def check_backends(report: Report, root: Path, dry_run: bool) -> None:
    for name in REAL_SHAPES:
        path = model_folder(root, name, dry_run)
        for page_size in (1, 16):
            for scenario in sorted(SCENARIOS):
                start = time.perf_counter()
                try:
                    steps = 4 if dry_run else 32
                    ours = run_scenario(make_runner(path, "flashinfer", page_size, dry_run), scenario, steps)
                    oracle = run_scenario(make_runner(path, "torch", page_size, dry_run), scenario, steps)
                    err = max_logit_error(ours, oracle)
                    report.add("flashinfer_vs_torch", err < BF16_LOGIT_TOLERANCE, shape=name, page_size=page_size,
                               scenario=scenario, max_logit_err=round(err, 5), s=round(time.perf_counter() - start, 1))
                except Exception as exc:  # noqa: BLE001 - every case reports, whatever breaks
                    report.add("flashinfer_vs_torch", False, shape=name, page_size=page_size, scenario=scenario,
                               error=f"{type(exc).__name__}: {exc}", trace=traceback.format_exc(limit=4))


def _decode(runner, batch: int, steps: int) -> tuple[list[list[int]], list[torch.Tensor]]:
    """Greedy decode of `batch` requests (prompt 16 tokens each) for `steps` steps: each row's
    tokens, and each decode step's fp32 logits [batch, vocab] (on the CPU)."""
    from runtime.contracts.sampling import SamplingParams
    from runtime.execution.forward_batch import ForwardEntry

    greedy = SamplingParams(temperature=0.0)
    region = 16 + steps + 1
    prompts = [ForwardEntry(row=r, input_ids=[(r * 13 + i) % 1000 + 1 for i in range(16)], prefix_len=0,
                            kv_write=list(range(1 + r * region, 17 + r * region)), kv_write_start=0, sampling=greedy)
               for r in range(batch)]
    last = runner.forward(prompts).host_next_ids()
    out = [[t] for t in last]
    logits = []
    for step in range(steps):
        n = 16 + step
        entries = [ForwardEntry(row=r, input_ids=[out[r][-1]], prefix_len=n, kv_write=[1 + r * region + n],
                                kv_write_start=n, sampling=greedy) for r in range(batch)]
        result = runner.forward(entries, keep_logits=True)
        for r, t in enumerate(result.host_next_ids()):
            out[r].append(t)
        logits.append(result.last_logits.float().cpu())
    return out, logits


def compare_decodes(eager: tuple[list[list[int]], list[torch.Tensor]],
                    graphed: tuple[list[list[int]], list[torch.Tensor]],
                    replays: int, steps: int, tolerance: float) -> tuple[bool, dict[str, Any]]:
    """Graph replay against eager: the same greedy tokens, logits within `tolerance`, and every
    decode step replayed (a graphed runner that silently ran eagerly would compare eager with
    eager). Returns (ok, the record's fields)."""
    same_tokens = graphed[0] == eager[0]
    err = max_logit_error(graphed[1], eager[1])
    fields = {"same_tokens": same_tokens, "max_logit_err": round(err, 6), "replays": replays, "steps": steps}
    return same_tokens and err <= tolerance and replays == steps, fields


def check_graphs(report: Report, root: Path, dry_run: bool, batches: tuple[int, ...] = (1, 3, 8),
                 steps: int = 32) -> None:
    """Decode through the graph replay path (captured graphs; on CPU their eager stand-ins, with
    the same static buffers, padding and per-bucket planning) against a plain eager runner."""
    path = model_folder(root, "llama-3.2-1b", dry_run)
    for batch in batches:
        try:
            eager = _decode(make_runner(path, "flashinfer", 1, dry_run), batch, steps)
            graphed = make_runner(path, "flashinfer", 1, dry_run)
            graphed.init_cuda_graphs(8, capture=not dry_run)
            replays = _count_replays(graphed)
            ok, fields = compare_decodes(eager, _decode(graphed, batch, steps), replays["n"], steps,
                                         GRAPH_LOGIT_TOLERANCE if dry_run else BF16_LOGIT_TOLERANCE)
            report.add("cuda_graph_vs_eager", ok, batch=batch, **fields)
        except Exception as exc:  # noqa: BLE001
            report.add("cuda_graph_vs_eager", False, batch=batch, error=f"{type(exc).__name__}: {exc}",
                       trace=traceback.format_exc(limit=4))


def _count_replays(runner) -> dict[str, int]:
    """Count the runner's graph replays from now on (a dict the caller reads after decoding)."""
    graphs = runner.graphs
    assert graphs is not None, "init_cuda_graphs() first"
    count = {"n": 0}
    run = graphs.run

    def counted(entries):
        count["n"] += 1
        return run(entries)

    graphs.run = counted
    return count


def measure_decode(report: Report, root: Path, dry_run: bool) -> None:
    """Decode tokens/s per batch size with graphs on and off, and the GPU's idle share between steps."""
    from runtime.execution.forward_batch import ForwardEntry

    path = model_folder(root, "llama-3.2-1b", dry_run)
    batches = (1, 4) if dry_run else DECODE_BATCHES
    steps = 4 if dry_run else 64
    for graphs in (False, True):
        runner = make_runner(path, "flashinfer", 1, dry_run, max_running=max(batches), kv_tokens=max(batches) * 600)
        if graphs:
            runner.init_cuda_graphs(max(batches), capture=not dry_run)
        for batch in batches:
            try:
                ctx = 512
                region = ctx + steps + 1
                prefill = [ForwardEntry(row=r, input_ids=[1] * ctx, prefix_len=0,
                                        kv_write=list(range(1 + r * region, 1 + r * region + ctx)), kv_write_start=0)
                           for r in range(batch)]
                for i in range(0, batch, 8):
                    runner.forward(prefill[i : i + 8])
                timing = _timed_decode(runner, batch, ctx, region, steps)
                # A measurement, not a check: no threshold is known to hold on the lent GPU yet.
                report.info("decode_speed", cuda_graph=graphs, batch=batch, context=ctx, **timing)
            except Exception as exc:  # noqa: BLE001
                report.add("decode_speed", False, cuda_graph=graphs, batch=batch, error=f"{type(exc).__name__}: {exc}")


def _timed_decode(runner, batch: int, ctx: int, region: int, steps: int) -> dict[str, float]:
    from runtime.execution.forward_batch import ForwardEntry

    cuda = runner.device.type == "cuda"
    events = []
    start = time.perf_counter()
    for step in range(steps):
        n = ctx + step
        entries = [ForwardEntry(row=r, input_ids=[5], prefix_len=n, kv_write=[1 + r * region + n], kv_write_start=n)
                   for r in range(batch)]
        if cuda:
            begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            begin.record(runner.stream)
        result = runner.forward(entries)
        if cuda:
            end.record(runner.stream)
            events.append((begin, end))
        result.host_next_ids()
    wall = time.perf_counter() - start
    timing = {"tok_per_s": round(batch * steps / wall, 1), "step_ms": round(1000 * wall / steps, 3)}
    if cuda:
        torch.cuda.synchronize()
        busy = sum(b.elapsed_time(e) for b, e in events)
        span = events[0][0].elapsed_time(events[-1][1])
        timing["gpu_idle_between_steps"] = round(1 - busy / span, 3) if span > 0 else 0.0
    return timing


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--dry-run", action="store_true", help="on CPU, tiny shapes, FlashInfer's stand-in")
    parser.add_argument("--only", default="backends,graphs,speed", help="comma-separated parts to run")
    args = parser.parse_args()
    report = Report(args.out)
    if args.dry_run:
        from tests.kernels import fake_flashinfer

        fake_flashinfer.install_module()
    elif not torch.cuda.is_available():
        print("gpu_check: no CUDA device (use --dry-run on CPU)", file=sys.stderr)
        return 2
    parts = {"backends": check_backends, "graphs": check_graphs, "speed": measure_decode}
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.only.split(","):
            parts[name](report, Path(tmp), args.dry_run)
    return report.finish()


if __name__ == "__main__":
    sys.exit(main())
