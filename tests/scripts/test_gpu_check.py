"""The GPU check's dry run: scripts/gpu_check.sh --dry-run runs the same code path on CPU (tiny
shapes, FlashInfer's stand-in), so its Python errors are found here and not on the lent GPU."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_dry_run_reports_every_part(tmp_path: Path) -> None:
    out = tmp_path / "check"
    run = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_check.sh"), "--dry-run", str(out)],
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    records = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    kinds = {r["kind"] for r in records}
    assert kinds == {"flashinfer_vs_torch", "cuda_graph_vs_eager", "decode_speed"}, kinds
    assert all(r["ok"] for r in records), [r for r in records if not r["ok"]]
    assert len([r for r in records if r["kind"] == "flashinfer_vs_torch"]) == 2 * 2 * 5
    assert {(r["cuda_graph"], r["batch"]) for r in records if r["kind"] == "decode_speed"} == {
        (False, 1), (False, 4), (True, 1), (True, 4)}
    assert (out / "summary.txt").read_text().endswith("0 failed\n")
    assert "dry run: 1" in (out / "environment.txt").read_text()
