"""The GPU check's dry run: scripts/gpu_check.sh --dry-run runs the same code path on CPU (tiny
shapes, FlashInfer's stand-in), so its Python errors are found here and not on the lent GPU.
Its CUDA-graph check goes through the replay path (eager stand-ins for the graphs) and fails
when the replay's output differs from eager, or when no graph was replayed; decode speed is
informational."""

from __future__ import annotations

import ast
import importlib.util
import json
import subprocess
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


def test_dry_run_reports_every_part(tmp_path: Path) -> None:
    out = tmp_path / "check"
    run = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_check.sh"), "--dry-run", str(out)],
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    records = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    kinds = {r["kind"] for r in records}
    assert kinds == {"flashinfer_vs_torch", "cuda_graph_vs_eager", "decode_speed"}, kinds
    checks = [r for r in records if r["kind"] != "decode_speed"]
    assert all(r["status"] == "ok" and r["ok"] is True for r in checks), [r for r in checks if not r["ok"]]
    assert len([r for r in records if r["kind"] == "flashinfer_vs_torch"]) == 2 * 2 * 5
    graphs = [r for r in records if r["kind"] == "cuda_graph_vs_eager"]
    assert [(r["batch"], r["replays"], r["steps"]) for r in graphs] == [(1, 32, 32), (3, 32, 32), (8, 32, 32)]
    speed = [r for r in records if r["kind"] == "decode_speed"]
    assert all(r["status"] == "info" and r["ok"] is None and r["tok_per_s"] > 0 for r in speed), speed
    assert {(r["cuda_graph"], r["batch"]) for r in speed} == {(False, 1), (False, 4), (True, 1), (True, 4)}
    summary = (out / "summary.txt").read_text()
    assert summary.endswith("0 failed\n") and "info decode_speed" in summary and "ok   decode_speed" not in summary
    assert "dry run: 1" in (out / "environment.txt").read_text()


def test_compare_decodes_fails_on_any_difference() -> None:
    compare = _gpu_check().compare_decodes
    tokens, logits = [[1, 2, 3]], [torch.zeros(1, 8), torch.ones(1, 8)]
    eager = (tokens, logits)
    assert compare(eager, (tokens, [x.clone() for x in logits]), 2, 2, 1e-4)[0]
    assert not compare(eager, ([[1, 2, 4]], logits), 2, 2, 1e-4)[0]  # another token
    assert not compare(eager, (tokens, [logits[0], logits[1] + 1e-3]), 2, 2, 1e-4)[0]  # same tokens, other logits
    assert not compare(eager, (tokens, logits), 0, 2, 1e-4)[0]  # eager against eager: nothing replayed


@pytest.mark.parametrize("fault", ["none", "replay_output_shifted", "never_replayed"])
def test_the_graph_check_fails_when_the_replay_path_differs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                            fake_flashinfer, fault: str) -> None:  # noqa: F811
    """The dry run's graph check on a 3-row batch (padded to the bucket of 4), with a fault put
    into the stand-in replay: a logits shift too small to change a greedy token, or graphs that
    never run (every step eager)."""
    from runtime.execution.cuda_graph import CudaGraphRunner

    if fault == "replay_output_shifted":
        forward = CudaGraphRunner._forward

        def shifted(self, size: int) -> None:
            forward(self, size)
            self.outputs[size] += 1e-3

        monkeypatch.setattr(CudaGraphRunner, "_forward", shifted)
    elif fault == "never_replayed":
        monkeypatch.setattr(CudaGraphRunner, "can_run", lambda self, entries: False)
    check = _gpu_check()
    report = check.Report(tmp_path / "out")
    check.check_graphs(report, tmp_path, dry_run=True, batches=(3,), steps=4)
    (record,) = [json.loads(line) for line in report.path.read_text().splitlines()]
    assert "error" not in record, record
    assert record["ok"] is (fault == "none"), record
    assert record["same_tokens"] is True  # a shift of 1e-3 keeps the greedy tokens: the logits decide
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
    modules = sorted(p for p in (ROOT / "tests").rglob("test_*.py") if "pytest.mark.gpu" in p.read_text())
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
