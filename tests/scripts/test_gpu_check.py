"""The GPU check's dry run: scripts/gpu_check.sh --dry-run runs the same code path on CPU (tiny
shapes, FlashInfer's stand-in), so its Python errors are found here and not on the lent GPU.
Its CUDA-graph check goes through the replay path (eager stand-ins for the graphs) and fails
when the replay's output differs from eager, or when no graph was replayed; decode speed is
informational."""

from __future__ import annotations

import ast
import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.runtime.execution.tiny_runner import fake_flashinfer  # noqa: F401 (a fixture)

ROOT = Path(__file__).resolve().parents[2]


def _gpu_check():
    spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "scripts" / "gpu_check.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


STAGES = ["environment", "wheels", "compile", "plan", "backends", "graphs", "speed", "gpu_tests"]


def test_dry_run_runs_every_stage_within_the_8_minute_plan(tmp_path: Path) -> None:
    out = tmp_path / "check"
    run = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_check.sh"), "--dry-run", str(out)],
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-3000:] + (out / "log.txt").read_text()[-3000:]
    records = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert all(r["status"] in ("ok", "info") for r in records), [r for r in records if r["status"] == "FAIL"]
    stages = [r for r in records if r["kind"] == "stage"]
    assert [r["stage"] for r in stages] == STAGES
    # The plan: every stage's bound adds up to at most 8 minutes, the compile's included, and each
    # stage's dry run takes a fraction of its bound (the GPU adds CUDA start-up and real shapes).
    assert sum(r["bound_s"] for r in stages) <= 480
    assert next(r["bound_s"] for r in stages if r["stage"] == "compile") >= 160  # see the assumption in gpu_check.sh
    assert all(r["s"] < r["bound_s"] for r in stages), stages
    (compiled,) = [r for r in records if r["kind"] == "flashinfer_compile"]
    assert (compiled["modules"], compiled["prebuilt"], compiled["missing"]) == (8, 0, [])
    archives = sorted(p.name for p in out.glob("aot-*.tar.xz"))
    assert archives == ["aot-attention-hd128.tar.xz", "aot-attention-hd64.tar.xz", "aot-elementwise.tar.xz"]
    plans = [r for r in records if r["kind"] == "plan_speed"]
    assert {(r["staging"], r["batch"]) for r in plans} == {(s, b) for s in ("pinned_pair", "pageable") for b in (1, 4)}
    assert len([r for r in records if r["kind"] == "flashinfer_vs_torch"]) == 2 * 2 * 5
    graphs = [r for r in records if r["kind"] == "cuda_graph_vs_eager"]
    assert [(r["batch"], r["replays"], r["steps"]) for r in graphs] == [(1, 32, 32), (3, 32, 32), (8, 32, 32)]
    speed = [r for r in records if r["kind"] == "decode_speed"]
    assert all(r["status"] == "info" and r["ok"] is None and r["tok_per_s"] > 0 for r in speed), speed
    assert {(r["cuda_graph"], r["batch"]) for r in speed} == {(False, 1), (False, 4), (True, 1), (True, 4)}
    summary = (out / "summary.txt").read_text()
    assert summary.endswith("0 failed\n") and "info decode_speed" in summary and "ok   decode_speed" not in summary
    assert "dry run: 1" in (out / "log.txt").read_text()
    # What comes back from the GPU machine: at most 8 files.
    assert len(list(out.iterdir())) <= 8


def test_a_second_run_loads_the_archived_modules_instead_of_building(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                     fake_flashinfer) -> None:  # noqa: F811
    import types

    from tests.kernels import fake_flashinfer_jit

    sys.path.insert(0, str(ROOT / "scripts"))
    monkeypatch.setattr(sys, "path", sys.path)
    import gpu_compile

    for name in ("flashinfer.jit", *(f"flashinfer.jit.{sub}" for sub in ("norm", "rope", "sampling", "activation"))):
        monkeypatch.setitem(sys.modules, name, types.ModuleType("placeholder"))  # undone after the test
    check = _gpu_check()
    first, second = tmp_path / "first", tmp_path / "second"
    fake_flashinfer_jit.install_module(tmp_path / "machine1")
    gpu_compile.run(check.Report(first), first, archives=None)
    assert len(fake_flashinfer_jit.BUILT[-1]) == 8
    fake_flashinfer_jit.install_module(tmp_path / "machine2")  # a fresh machine: nothing built
    gpu_compile.run(check.Report(second), second, archives=first)
    assert fake_flashinfer_jit.BUILT[-1] == []  # every module came from the archives
    records = [json.loads(line) for line in (second / "results.jsonl").read_text().splitlines()]
    (compiled,) = [r for r in records if r["kind"] == "flashinfer_compile"]
    assert (compiled["prebuilt"], compiled["ok"]) == (8, True)
    assert not list(second.glob("aot-*.tar.xz"))  # nothing new to bring back


def test_compare_decodes_fails_on_logits_or_replays_not_on_tokens() -> None:
    compare = _gpu_check().compare_decodes
    tokens, logits = [[1, 2, 3]], [torch.zeros(1, 8), torch.ones(1, 8)]
    eager = (tokens, logits)
    assert compare(eager, (tokens, [x.clone() for x in logits]), 2, 2, 1e-4)[0]
    ok, fields = compare(eager, ([[1, 2, 4]], logits), 2, 2, 1e-4)  # a near-tie flipped: logits decide
    assert ok and fields["same_tokens"] == round(2 / 3, 3)
    assert not compare(eager, (tokens, [logits[0], logits[1] + 1e-3]), 2, 2, 1e-4)[0]  # other logits
    assert not compare(eager, (tokens, logits), 0, 2, 1e-4)[0]  # eager against eager: nothing replayed


@pytest.mark.parametrize("fault", ["none", "replay_output_shifted", "never_replayed"])
def test_the_graph_check_fails_when_the_replay_path_differs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                            fake_flashinfer, fault: str) -> None:  # noqa: F811
    """The dry run's graph check on a 3-row batch (padded to the bucket of 4), with a fault put
    into the stand-in replay: a logits shift over the tolerance that changes no greedy token (the
    same shift for the whole vocabulary), or graphs that never run (every step eager)."""
    from runtime.execution.cuda_graph import CudaGraphRunner

    check = _gpu_check()
    if fault == "replay_output_shifted":
        forward = CudaGraphRunner._forward

        def shifted(self, size: int) -> None:
            forward(self, size)
            self.logits[:size] += 4 * check.LOGIT_TOLERANCE

        monkeypatch.setattr(CudaGraphRunner, "_forward", shifted)
    elif fault == "never_replayed":
        monkeypatch.setattr(CudaGraphRunner, "can_run", lambda self, entries: False)
    report = check.Report(tmp_path / "out")
    check.check_graphs(report, tmp_path, dry_run=True, batches=(3,), steps=4)
    (record,) = [json.loads(line) for line in report.path.read_text().splitlines()]
    assert "error" not in record, record
    assert record["ok"] is (fault == "none"), record
    assert record["same_tokens"] == 1.0
    assert record["replays"] == (0 if fault == "never_replayed" else 4), record


# Clients the GPU image lacks and scripts/gpu_wheels.sh does not carry (ENVIRONMENT.md, GPU).
ABSENT_ON_GPU_IMAGE = {"openai", "anthropic", "gguf"}


def _top_level_imports(path: Path) -> set[str]:
    """Modules `path` imports when it is imported: its module-level import statements (imports
    inside functions, `if`, or `try` blocks are lazy, guarded or optional)."""
    names: set[str] = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def _project_files(module: str) -> list[Path]:
    """The files importing `module` runs, when it is one of ours (each package's __init__ too)."""
    parts, files = module.split("."), []
    for depth in range(1, len(parts) + 1):
        base = ROOT.joinpath(*parts[:depth])
        for candidate in (base / "__init__.py", base.with_suffix(".py")):
            if candidate.is_file():
                files.append(candidate)
    return files


def test_the_gpu_tests_import_nothing_the_gpu_image_lacks() -> None:
    """scripts/gpu_check.sh runs pytest on the modules that hold GPU tests; following their
    module-level imports through our own modules must not reach a client the image lacks, or
    collection fails there before any GPU test runs."""
    marked = re.compile(r"^@pytest\.mark\.gpu", re.MULTILINE)  # as scripts/gpu_check.sh finds them
    modules = sorted(p for p in (ROOT / "tests").rglob("test_*.py") if marked.search(p.read_text()))
    assert modules, "no module holds a GPU test"
    seen: set[Path] = set()
    todo = [*modules, ROOT / "tests" / "conftest.py"]
    third_party: dict[str, Path] = {}
    while todo:
        path = todo.pop()
        if path in seen:
            continue
        seen.add(path)
        for name in _top_level_imports(path):
            ours = _project_files(name)
            todo.extend(ours)
            if not ours:
                third_party.setdefault(name.split(".")[0], path)
    needed = {name: str(path.relative_to(ROOT)) for name, path in third_party.items() if name in ABSENT_ON_GPU_IMAGE}
    assert not needed, f"imported at module level on the GPU tests' path: {needed}"
