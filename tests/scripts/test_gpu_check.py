"""The GPU check's dry run: scripts/gpu_check.sh --dry-run runs the same code path on CPU (tiny
shapes, FlashInfer's stand-in), so its Python errors are found here and not on the lent GPU.
Its CUDA-graph check goes through the replay path (eager stand-ins for the graphs) and fails
when the replay's output differs from eager, or when no graph was replayed; decode speed is
informational."""

from __future__ import annotations

import ast
import importlib.util
import inspect
import json
import re
import subprocess
import sys
import types
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.runtime.execution.tiny_runner import fake_flashinfer  # noqa: F401 (a fixture)

ROOT = Path(__file__).resolve().parents[2]


def _gpu_check() -> types.ModuleType:
    spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "scripts" / "gpu_check.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


STAGES = ["environment", "wheels", "compile", "plan", "backends", "graphs", "speed", "gpu_tests"]
JIT_MODULES = ["flashinfer.jit", *(f"flashinfer.jit.{sub}" for sub in ("norm", "rope", "sampling", "activation"))]


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[dict[str, Any]]]:
    """One dry run of scripts/gpu_check.sh for this module's tests: its OUT_DIR and records."""
    out = tmp_path_factory.mktemp("check")
    run = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_check.sh"), "--dry-run", str(out)],
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-3000:] + (out / "log.txt").read_text()[-3000:]
    return out, [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]


def test_dry_run_runs_every_stage_within_the_plan(dry_run: tuple[Path, list[dict[str, Any]]]) -> None:
    out, records = dry_run
    assert all(r["status"] in ("ok", "info") for r in records), [r for r in records if r["status"] == "FAIL"]
    stages = [r for r in records if r["kind"] == "stage"]
    assert [r["stage"] for r in stages] == STAGES
    # The plan fits one command (10 minutes) with time to summarize, and each stage's dry run
    # takes a fraction of its bound (the GPU adds CUDA start-up and real shapes).
    assert sum(r["bound_s"] for r in stages) <= 490
    assert next(r["bound_s"] for r in stages if r["stage"] == "compile") >= 240  # see gpu_check.sh's plan
    assert all(r["s"] < r["bound_s"] for r in stages), stages
    (compiled,) = [r for r in records if r["kind"] == "flashinfer_compile"]
    assert (len(compiled["modules"]), compiled["prebuilt"], compiled["missing"]) == (6, 0, [])
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


def _module_names(layouts: list[Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> set[str]:
    """FlashInfer's names (the stand-in's, in the real format) of the modules these layouts load."""
    from kernels.flashinfer_jit import needed_modules
    from tests.kernels import fake_flashinfer_jit

    for name in JIT_MODULES:
        monkeypatch.setitem(sys.modules, name, types.ModuleType("placeholder"))  # undone after the test
    jit = fake_flashinfer_jit.install_module(tmp_path)
    return {m.spec(jit).name for m in needed_modules(layouts, [torch.bfloat16])}


def test_the_compile_builds_what_the_stages_load(dry_run: tuple[Path, list[dict[str, Any]]], tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """The dry run's stages run the real attention layouts, so the modules they load (recorded by
    the stand-in) are the GPU run's: the compile builds those, and the GPU tests' on top, no more."""
    from kernels.flashinfer_jit import needed_modules

    check = _gpu_check()
    _, records = dry_run
    loaded = {name for r in records if r["kind"] == "flashinfer_modules_loaded" for name in r["names"]}
    stage_layouts = [layout for layout in check.attention_layouts() if layout not in check.GPU_TEST_LAYOUTS]
    assert loaded == _module_names(stage_layouts, tmp_path, monkeypatch)
    (compiled,) = [r for r in records if r["kind"] == "flashinfer_compile"]
    assert compiled["modules"] == [m.label for m in needed_modules(check.attention_layouts(), [torch.bfloat16])]
    only_gpu_tests = set(compiled["modules"]) - {m.label for m in needed_modules(stage_layouts, [torch.bfloat16])}
    assert only_gpu_tests == {"decode-hd64-bfloat16"}  # group 3 decodes on CUDA cores


def test_the_dry_run_shapes_keep_the_attention_layouts_and_the_gpu_tests_theirs() -> None:
    from tests.kernels import test_attention_backends as gpu_tests

    check = _gpu_check()
    assert {k: v[:3] for k, v in check.TINY_SHAPES.items()} == {k: v[:3] for k, v in check.REAL_SHAPES.items()}
    (layout,) = check.GPU_TEST_LAYOUTS
    assert (layout.heads, layout.kv_heads) == (gpu_tests.HEADS, gpu_tests.KV_HEADS)
    source = inspect.getsource(gpu_tests.test_flashinfer_matches_torch_backend)
    assert f"KV_HEADS, {layout.head_dim}, torch.bfloat16" in source


def test_speed_captures_only_the_batches_it_measures(dry_run: tuple[Path, list[dict[str, Any]]]) -> None:
    _, records = dry_run
    measured = sorted({r["batch"] for r in records if r["kind"] == "decode_speed"})
    assert [r["sizes"] for r in records if r["kind"] == "cuda_graph_sizes"] == [measured]


@pytest.mark.parametrize("installed", [True, False], ids=["installed", "planted_left_in_cached_ops"])
def test_a_stage_after_compile_loads_what_compile_built(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                        installed: bool) -> None:
    """compile, then plan, as the dry run runs them (their own FlashInfer stand-ins over one shared
    workspace). Planted: the built libraries left where ninja built them, not installed in the
    AOT directory; the plan stage's calls would then recompile them, which fails it."""
    from kernels import flashinfer_jit

    if not installed:
        monkeypatch.setattr(flashinfer_jit, "install_built", lambda spec: None)
    for name in ["flashinfer", *JIT_MODULES]:
        monkeypatch.setitem(sys.modules, name, types.ModuleType("placeholder"))  # undone after the test
    monkeypatch.setenv("FLASHINFER_WORKSPACE_BASE", str(tmp_path / "flashinfer"))
    monkeypatch.syspath_prepend(str(ROOT / "scripts"))
    check = _gpu_check()
    out = tmp_path / "out"
    assert check.run_stage("compile", out, True, None) == 0
    try:
        plan_rc = check.run_stage("plan", out, True, None)
    except Exception as exc:  # noqa: BLE001 - main() records a stage that raises as failed
        plan_rc, error = 1, f"{type(exc).__name__}: {exc}"
    else:
        error = ""
    assert plan_rc == (0 if installed else 1)
    if not installed:
        assert error.startswith("LateCompile") and "holds no ninja log" in error, error


def test_a_second_run_loads_the_archived_modules_instead_of_building(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                     fake_flashinfer) -> None:  # noqa: F811
    from tests.kernels import fake_flashinfer_jit

    monkeypatch.syspath_prepend(str(ROOT / "scripts"))
    import gpu_compile

    for name in JIT_MODULES:
        monkeypatch.setitem(sys.modules, name, types.ModuleType("placeholder"))  # undone after the test
    check = _gpu_check()
    first, second = tmp_path / "first", tmp_path / "second"
    fake_flashinfer_jit.install_module(tmp_path / "machine1")
    gpu_compile.run(check.Report(first), first, None, check.attention_layouts())
    assert len(fake_flashinfer_jit.BUILT[-1]) == 6
    fake_flashinfer_jit.install_module(tmp_path / "machine2")  # a fresh machine: nothing built
    gpu_compile.run(check.Report(second), second, first, check.attention_layouts())
    assert fake_flashinfer_jit.BUILT[-1] == []  # every module came from the archives
    records = [json.loads(line) for line in (second / "results.jsonl").read_text().splitlines()]
    (compiled,) = [r for r in records if r["kind"] == "flashinfer_compile"]
    assert (compiled["prebuilt"], compiled["ok"]) == (6, True)
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
    absent = _gpu_check().ABSENT_ON_GPU_IMAGE
    needed = {name: str(path.relative_to(ROOT)) for name, path in third_party.items() if name in absent}
    assert not needed, f"imported at module level on the GPU tests' path: {needed}"


def test_the_dry_run_fails_a_stage_that_imports_what_the_gpu_image_lacks(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    check = _gpu_check()
    for name in [n for n in sys.modules if n.split(".")[0] in check.ABSENT_ON_GPU_IMAGE]:
        monkeypatch.delitem(sys.modules, name)  # imported by other tests of this process; put back after
    report = check.Report(tmp_path)
    before = set(sys.modules)
    check._report_dry_run(report, "plan", before)
    assert report.failed == 0
    monkeypatch.setitem(sys.modules, "orjson", types.ModuleType("orjson"))  # as if a stage imported it
    check._report_dry_run(report, "plan", before)
    record = json.loads(report.path.read_text().splitlines()[-1])
    assert (record["kind"], record["ok"], record["absent_there"]) == ("gpu_image_imports", False, ["orjson"])
