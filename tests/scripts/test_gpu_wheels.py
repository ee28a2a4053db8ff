"""scripts/gpu_wheels.sh: the folder the GPU check carries holds exactly the two pinned wheels
(and an earlier run's archives when named), nothing stale, and stays under its limit with the
compile stage's archives, leaving the working tree its share of what a call carries."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.kernels.flashinfer_wheel import pinned_wheels, pins

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "gpu_wheels.sh"
CARRY_LIMIT = 64 << 20  # what one `run` call carries: the working tree and the carried paths
MIB = 1 << 20


def _run(out: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "GPU_WHEELS_DIR": str(out), "PYTHON": sys.executable}
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, env=env, timeout=60)


def _limit_mib() -> int:
    match = re.search(r"^LIMIT_MIB=(\d+)", SCRIPT.read_text(), re.MULTILINE)
    assert match
    return int(match.group(1))


def test_it_clears_the_folder_and_fetches_exactly_the_two_pins(tmp_path: Path) -> None:
    out, earlier = tmp_path / "wheels", tmp_path / "earlier"
    (out / "site").mkdir(parents=True)
    (out / "pyzmq-26.0.0-cp312-cp312-manylinux_2_28_x86_64.whl").write_bytes(b"stale")
    earlier.mkdir()
    (earlier / "aot-attention-hd64.tar.xz").write_bytes(b"archive")
    (earlier / "log.txt").write_text("not carried")
    run = _run(out, "--dry-run", str(earlier))
    assert run.returncode == 0, run.stderr
    downloads = [line for line in run.stdout.splitlines() if line.startswith("would run:")]
    pinned = ["flashinfer-python==0.6.18.post1", "apache-tvm-ffi==0.1.15.post2"]
    assert [line.split()[-1] for line in downloads] == pinned
    assert all("--no-deps" in line and "--python-version 3.12" in line and "manylinux" in line for line in downloads)
    assert sorted(str(p.relative_to(out)) for p in out.rglob("*")) == ["aot", "aot/aot-attention-hd64.tar.xz"]


def test_it_refuses_a_folder_over_its_limit(tmp_path: Path) -> None:
    earlier = tmp_path / "earlier"
    earlier.mkdir()
    with (earlier / "aot-huge.tar.xz").open("wb") as fh:
        fh.truncate((_limit_mib() + 1) * MIB)  # sparse: its apparent size is what counts
    run = _run(tmp_path / "wheels", "--dry-run", str(earlier))
    assert run.returncode != 0 and "over" in run.stderr


def test_the_flashinfer_pin_is_pyprojects_gpu_extra() -> None:
    extra = re.search(r'^gpu = \["([^"]+)"\]', (ROOT / "pyproject.toml").read_text(), re.MULTILINE)
    assert extra and extra.group(1) == f"flashinfer-python=={pins()['flashinfer-python']}"


def _working_tree_bytes() -> int:
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                            capture_output=True, timeout=60)
    if listed.returncode != 0:
        pytest.skip("not a git checkout: the working tree's size is unknown")
    files = [ROOT / name for name in listed.stdout.decode().split("\0") if name]
    return sum(f.stat().st_size for f in files if f.is_file())


def test_the_wheels_and_the_archive_budget_fit_what_a_call_carries() -> None:
    """The real pinned wheels (fetched into the cache), plus every archive the compile stage may
    keep, stay under the script's limit; the limit leaves the working tree room with a margin."""
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import gpu_compile
    finally:
        sys.path.remove(str(ROOT / "scripts"))
    wheels = sum(path.stat().st_size for path in pinned_wheels().values())
    limit = _limit_mib() * MIB
    assert wheels + gpu_compile.ARCHIVES_BUDGET_BYTES <= limit, (wheels / MIB, limit / MIB)
    assert limit + _working_tree_bytes() <= CARRY_LIMIT - 4 * MIB
