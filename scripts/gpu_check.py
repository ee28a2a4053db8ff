"""The prepared device check's Python stages, on dummy weights of real model shapes. Each stage
runs as its own process under its own time bound (scripts/gpu_check.sh holds the plan):

    compile   the FlashInfer modules the later stages load, built ahead of time and installed where
              FlashInfer loads them from, timed, archived (gpu_compile.py)
    plan      the host cost of plan() at batch 1/32/256, pinned vs pageable staging (gpu_plan_bench.py)
    backends  FlashInfer against the torch backend, every scenario, logits within a tolerance
    graphs    CUDA-graph replay against eager, logits within a tolerance, every step replayed
    speed     decode tokens/s at batch 1/32/128/256, graphs off and on (captured for those batch
              sizes only), the GPU's idle share

    python scripts/gpu_check.py OUT_DIR --stage NAME [--dry-run]   # one stage
    python scripts/gpu_check.py OUT_DIR --summarize                # summary.txt from results.jsonl

--dry-run runs the same code on CPU: tiny shapes, bf16, FlashInfer replaced by the strict stand-ins
tests/kernels/fake_flashinfer.py and fake_flashinfer_jit.py, which model FlashInfer's load path:
a stage whose calls would compile a module fails (so one stage alone needs the compile stage run
first over the same FLASHINFER_WORKSPACE_BASE), and each stage reports the modules it loaded, and
fails on an import the GPU image could not satisfy. Every result is appended to
OUT_DIR/results.jsonl as soon as it exists (a stage cut short still reports what it did). A
measurement without a pass/fail criterion (speeds) is "info", never "ok".

The shapes keep the real attention layout (heads, KV heads, head dim, vocabulary) with fewer
layers, so FlashInfer's kernels and their dispatch are the real ones while weights stay small.
Dummy weights give flat logits, so runs are compared by logits within a tolerance, never by
greedy tokens (a near-tie may flip legitimately: graph buckets pad the batch, and split-KV
attention may split differently), and both runs of a comparison are fed the same tokens.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any
from unittest import mock

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "scripts")]

import torch  # noqa: E402

from kernels.flashinfer_jit import AttentionLayout  # noqa: E402
from tests.kernels.backend_scenarios import SCENARIOS, max_logit_error, run_scenario  # noqa: E402
from tests.runtime.execution.tiny_runner import with_flashinfer_backend, write_config  # noqa: E402

# name: (heads, kv heads, head dim, hidden, intermediate, vocab); layers cut to LAYERS. The dry
# run's shapes keep the attention layout, so it loads the kernel modules the GPU run loads.
REAL_SHAPES = {
    "llama-3.2-1b": (32, 8, 64, 2048, 8192, 128256),
    "qwen2.5-7b-group7": (28, 4, 128, 3584, 18944, 152064),
}
TINY_SHAPES = {"llama-3.2-1b": (32, 8, 64, 128, 256, 512), "qwen2.5-7b-group7": (28, 4, 128, 128, 256, 512)}
# The GPU tests' layout (tests/kernels/test_attention_backends.py: 6 heads over 2 KV heads of 64,
# a group of 3, which decodes on CUDA cores): the gpu_tests stage loads its modules too.
GPU_TEST_LAYOUTS = (AttentionLayout(6, 2, 64),)
LAYERS = 4
# Max |difference| of logits between two bf16 runs (dummy weights give logits of order 1, where a
# bf16 step is 0.008): padding, split-KV and kernel choice move them by a few such steps.
LOGIT_TOLERANCE = 0.05
DECODE_BATCHES = (1, 32, 128, 256)
# Packages the GPU image lacks and scripts/gpu_wheels.sh does not carry: clients, and what serving
# needs but the check does not. A stage importing one would fail there.
ABSENT_ON_GPU_IMAGE = frozenset({"openai", "anthropic", "gguf", "zmq", "orjson", "xgrammar"})
STAGES = ("compile", "plan", "backends", "graphs", "speed")


class Report:
    """Appends to results.jsonl records {"kind", "status": "ok" | "FAIL" | "info", "ok": bool | None, ...}."""

    def __init__(self, out: Path) -> None:
        out.mkdir(parents=True, exist_ok=True)
        self.path = out / "results.jsonl"
        self.failed = 0

    def add(self, kind: str, ok: bool, **fields: Any) -> None:
        self._write(kind, "ok" if ok else "FAIL", ok, fields)

    def info(self, kind: str, **fields: Any) -> None:
        self._write(kind, "info", None, fields)

    def _write(self, kind: str, status: str, ok: bool | None, fields: dict[str, Any]) -> None:
        with self.path.open("a") as fh:
            fh.write(json.dumps({"kind": kind, "status": status, "ok": ok, **fields}) + "\n")
        print(summary_line({"kind": kind, "status": status, **fields}), flush=True)
        self.failed += status == "FAIL"


def summary_line(record: dict[str, Any]) -> str:
    fields = {k: v for k, v in record.items() if k not in ("kind", "status", "ok", "trace")}
    return f"{record['status']:4} {record['kind']} " + " ".join(f"{k}={v}" for k, v in fields.items())


def summarize(out: Path) -> int:
    """summary.txt: one line per record, then the count of failures; 1 when any failed."""
    records = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines() if line]
    failed = sum(r["status"] == "FAIL" for r in records)
    (out / "summary.txt").write_text("".join(summary_line(r) + "\n" for r in records) + f"{failed} failed\n")
    return 1 if failed else 0


def attention_layouts() -> list[AttentionLayout]:
    """Every attention layout a stage runs FlashInfer on: what the compile stage builds for."""
    return [AttentionLayout(*shape[:3]) for shape in REAL_SHAPES.values()] + list(GPU_TEST_LAYOUTS)


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

    cfg = resolve_config(ServerConfig(
        model_path=path, device="cpu" if dry_run else "cuda", load_format="dummy",
        dtype="bfloat16",  # FlashInfer has no fp32 kernels, and its stand-in refuses fp32 q as it does
        page_size=page_size, attention_backend="torch" if dry_run else backend, max_total_tokens=kv_tokens,
        max_running_requests=max_running, context_length=2048, disable_cuda_graph=True,
    ))
    loaded = load_model_for_serving(cfg)
    if dry_run and backend == "flashinfer":
        loaded = with_flashinfer_backend(loaded)
    runner = ModelRunner(loaded)
    runner.warmup()
    return runner


def check_backends(report: Report, root: Path, dry_run: bool) -> None:
    """Every scenario on FlashInfer against the torch backend; one runner per (shape, backend,
    page size), reused across scenarios (each scenario writes the KV it reads)."""
    steps = 4 if dry_run else 32
    for name in REAL_SHAPES:
        path = model_folder(root, name, dry_run)
        for page_size in (1, 16):
            runners: dict[str, Any] = {}
            for scenario in sorted(SCENARIOS):
                start = time.perf_counter()
                try:
                    for backend in ("flashinfer", "torch"):
                        if backend not in runners:
                            runners[backend] = make_runner(path, backend, page_size, dry_run)
                    ours = run_scenario(runners["flashinfer"], scenario, steps)
                    oracle = run_scenario(runners["torch"], scenario, steps)
                    err = max_logit_error(ours, oracle)
                    report.add("flashinfer_vs_torch", err < LOGIT_TOLERANCE, shape=name, page_size=page_size,
                               scenario=scenario, max_logit_err=round(err, 5), s=round(time.perf_counter() - start, 1))
                except Exception as exc:  # noqa: BLE001 - every case reports, whatever breaks
                    report.add("flashinfer_vs_torch", False, shape=name, page_size=page_size, scenario=scenario,
                               error=f"{type(exc).__name__}: {exc}", trace=traceback.format_exc(limit=4))


def _decode(runner, batch: int, steps: int) -> tuple[list[list[int]], list[torch.Tensor]]:
    """Decode `batch` requests (prompt 16 tokens each) for `steps` steps, every step fed fixed
    tokens (so two runners compared see the same inputs, whatever each samples): each row's
    greedy tokens, and each decode step's fp32 logits [batch, vocab] (on the CPU)."""
    from runtime.contracts.sampling import SamplingParams
    from runtime.execution.forward_batch import ForwardEntry

    greedy = SamplingParams(temperature=0.0)
    region = 16 + steps + 1
    prompts = [ForwardEntry(row=r, input_ids=[(r * 13 + i) % 1000 + 1 for i in range(16)], prefix_len=0,
                            kv_write=list(range(1 + r * region, 17 + r * region)), kv_write_start=0, sampling=greedy)
               for r in range(batch)]
    out = [[t] for t in runner.forward(prompts).host_next_ids()]
    logits = []
    for step in range(steps):
        n = 16 + step
        entries = [ForwardEntry(row=r, input_ids=[(r * 7 + step * 11) % 1000 + 1], prefix_len=n,
                                kv_write=[1 + r * region + n], kv_write_start=n, sampling=greedy) for r in range(batch)]
        result = runner.forward(entries, keep_logits=True)
        for r, t in enumerate(result.host_next_ids()):
            out[r].append(t)
        logits.append(result.last_logits.float().cpu())
    return out, logits


def compare_decodes(eager: tuple[list[list[int]], list[torch.Tensor]],
                    graphed: tuple[list[list[int]], list[torch.Tensor]],
                    replays: int, steps: int, tolerance: float) -> tuple[bool, dict[str, Any]]:
    """Graph replay against eager: logits within `tolerance` at every step, and every decode step
    replayed (a graphed runner that silently ran eagerly would compare eager with eager). The
    share of equal greedy tokens is reported, not required. Returns (ok, the record's fields)."""
    tokens = [t for row in eager[0] for t in row]
    same = sum(a == b for a, b in zip(tokens, [t for row in graphed[0] for t in row], strict=True))
    err = max_logit_error(graphed[1], eager[1])
    fields = {"max_logit_err": round(err, 6), "same_tokens": round(same / len(tokens), 3), "replays": replays,
              "steps": steps}
    return err <= tolerance and replays == steps, fields


def check_graphs(report: Report, root: Path, dry_run: bool, batches: tuple[int, ...] = (1, 3, 8),
                 steps: int = 32) -> None:
    """Decode through the graph replay path (captured graphs; on CPU their eager stand-ins, with
    the same static buffers, padding and per-bucket planning) against a plain eager runner."""
    path = model_folder(root, "llama-3.2-1b", dry_run)
    eager_runner = make_runner(path, "flashinfer", 1, dry_run)
    graphed = make_runner(path, "flashinfer", 1, dry_run)
    graphed.init_cuda_graphs(8, capture=not dry_run)
    replays = _count_replays(graphed)
    for batch in batches:
        try:
            replays["n"] = 0
            eager = _decode(eager_runner, batch, steps)
            ok, fields = compare_decodes(eager, _decode(graphed, batch, steps), replays["n"], steps, LOGIT_TOLERANCE)
            report.add("cuda_graph_vs_eager", ok, batch=batch, **fields)
        except Exception as exc:  # noqa: BLE001
            report.add("cuda_graph_vs_eager", False, batch=batch, error=f"{type(exc).__name__}: {exc}",
                       trace=traceback.format_exc(limit=4))


def _count_replays(runner) -> dict[str, int]:
    """Count the runner's graph replays from now on (a dict the caller reads after decoding)."""
    graphs = runner.graphs
    assert graphs is not None, "init_cuda_graphs() first"
    count = {"n": 0}
    replay = graphs.replay

    def counted(step, batch):  # type: ignore[no-untyped-def]
        count["n"] += 1
        return replay(step, batch)

    graphs.replay = counted
    return count


class StepTimer:
    """CUDA events at both ends of each step's device work (ModelRunner.step_marks): the GPU is
    idle between one step's end and the next one's beginning, host preparation included."""

    def __init__(self) -> None:
        self.events: list[tuple[torch.cuda.Event, torch.cuda.Event]] = []

    def device_work_begins(self) -> None:
        begin = torch.cuda.Event(enable_timing=True)
        begin.record()
        self.events.append((begin, begin))

    def device_work_ends(self) -> None:
        end = torch.cuda.Event(enable_timing=True)
        end.record()
        self.events[-1] = (self.events[-1][0], end)

    def idle_share(self) -> float:
        torch.cuda.synchronize()
        busy = sum(b.elapsed_time(e) for b, e in self.events)
        span = self.events[0][0].elapsed_time(self.events[-1][1])
        return max(0.0, 1 - busy / span) if span > 0 else 0.0


def measure_decode(report: Report, root: Path, dry_run: bool) -> None:
    """Decode tokens/s per batch size with graphs on and off, and the GPU's idle share between steps."""
    from runtime.execution.forward_batch import ForwardEntry

    path = model_folder(root, "llama-3.2-1b", dry_run)
    batches = (1, 4) if dry_run else DECODE_BATCHES
    steps = 4 if dry_run else 64
    for graphs in (False, True):
        runner = make_runner(path, "flashinfer", 1, dry_run, max_running=max(batches), kv_tokens=max(batches) * 600)
        if graphs:
            init_graphs(runner, batches, capture=not dry_run)
            report.info("cuda_graph_sizes", sizes=runner.graphs.sizes)
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


def init_graphs(runner: Any, sizes: tuple[int, ...], capture: bool) -> None:
    """Graphs for exactly `sizes`, the batches measured: ModelRunner.init_cuda_graphs captures every
    serving bucket up to the largest (35 up to 256, each capture a few forwards), which the speed
    stage's bound has no room for and would never replay."""
    from runtime.execution import cuda_graph

    with mock.patch.object(cuda_graph, "capture_batch_sizes", lambda max_bs: sorted(sizes)):
        runner.init_cuda_graphs(max(sizes), capture=capture)


def _timed_decode(runner, batch: int, ctx: int, region: int, steps: int) -> dict[str, float]:
    from runtime.execution.forward_batch import ForwardEntry

    timer = StepTimer() if runner.device.type == "cuda" else None
    runner.step_marks = timer
    start = time.perf_counter()
    for step in range(steps):
        n = ctx + step
        entries = [ForwardEntry(row=r, input_ids=[5], prefix_len=n, kv_write=[1 + r * region + n], kv_write_start=n)
                   for r in range(batch)]
        runner.forward(entries).host_next_ids()
    wall = time.perf_counter() - start
    runner.step_marks = None
    timing = {"tok_per_s": round(batch * steps / wall, 1), "step_ms": round(1000 * wall / steps, 3)}
    if timer is not None:
        timing["gpu_idle_between_steps"] = round(timer.idle_share(), 3)
    return timing


def run_stage(stage: str, out: Path, dry_run: bool, archives: Path | None) -> int:
    report = Report(out)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        if dry_run:
            _install_stand_ins(root)
        before = set(sys.modules)  # NOTE: in a test process, earlier tests imported what they use
        try:
            _run(stage, report, out, root, dry_run, archives)
        finally:
            if dry_run:
                _report_dry_run(report, stage, before)
    return 1 if report.failed else 0


def _report_dry_run(report: Report, stage: str, before: set[str]) -> None:
    """What the stage's calls loaded through FlashInfer's stand-in, and any import the GPU image
    could not satisfy (there the stage would fail on it): the modules the stage itself imported,
    not those already loaded when it began."""
    from tests.kernels import fake_flashinfer_jit

    report.info("flashinfer_modules_loaded", stage=stage, names=list(fake_flashinfer_jit.LOADED))
    absent = sorted(ABSENT_ON_GPU_IMAGE & {name.split(".")[0] for name in set(sys.modules) - before})
    if absent:
        report.add("gpu_image_imports", False, stage=stage, absent_there=absent)


def _install_stand_ins(root: Path) -> None:
    """FlashInfer's stand-ins, their JIT and AOT folders under FLASHINFER_WORKSPACE_BASE (one per
    check run, as on the GPU machine, where every stage's process shares FlashInfer's folders)."""
    from tests.kernels import fake_flashinfer, fake_flashinfer_jit

    fake_flashinfer.install_module()
    fake_flashinfer_jit.install_module(Path(os.environ.get("FLASHINFER_WORKSPACE_BASE") or root / "flashinfer"))


def _run(stage: str, report: Report, out: Path, root: Path, dry_run: bool, archives: Path | None) -> None:
    if stage == "compile":
        import gpu_compile

        gpu_compile.run(report, out, archives, attention_layouts())
    elif stage == "plan":
        import gpu_plan_bench

        path = model_folder(root, "llama-3.2-1b", dry_run)
        gpu_plan_bench.run(report, make_runner(path, "flashinfer", 1, dry_run, max_running=256,
                                               kv_tokens=4096 if dry_run else 256 * 1025 + 16), dry_run)
    else:
        {"backends": check_backends, "graphs": check_graphs, "speed": measure_decode}[stage](report, root, dry_run)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--stage", choices=STAGES)
    parser.add_argument("--summarize", action="store_true", help="write OUT/summary.txt from results.jsonl")
    parser.add_argument("--dry-run", action="store_true", help="on CPU, tiny shapes, FlashInfer's stand-ins")
    parser.add_argument("--archives", type=Path, help="compile: unpack these built libraries first")
    args = parser.parse_args()
    if args.summarize:
        return summarize(args.out)
    if args.stage is None:
        parser.error("--stage or --summarize")
    if not args.dry_run and not torch.cuda.is_available():
        print("gpu_check: no CUDA device (use --dry-run on CPU)", file=sys.stderr)
        return 2
    try:
        return run_stage(args.stage, args.out, args.dry_run, args.archives)
    except Exception as exc:  # noqa: BLE001 - a stage that cannot start still reports why
        Report(args.out).add(f"stage_{args.stage}", False, error=f"{type(exc).__name__}: {exc}",
                             trace=traceback.format_exc(limit=6))
        return 1


if __name__ == "__main__":
    sys.exit(main())
