"""Fixtures for the SGLang frontend tests: the frontend venv, a server, and the programs' results.

- `frontend_python`: runs scripts/setup_frontend_venv.sh (about 30-60 s the first time, then a
  no-op) and returns .venv-frontend's python. The setup needs PyPI: when it fails, the tests
  FAIL with its output (they are not skipped: CI has PyPI).
- `frontend_server`: our server (default model, float32, a free port): the run's `shared_server`.
- `run_programs(python, server, part, out)`: runs tests/frontend/programs.py for one part
  ("unconstrained", "constrained" or "all") and returns the JSON it wrote.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.tokenizer.http_helpers import REPO, RunningServer

SETUP_SCRIPT = os.path.join(REPO, "scripts", "setup_frontend_venv.sh")
FRONTEND_PYTHON = os.path.join(REPO, ".venv-frontend", "bin", "python")
PROGRAMS = os.path.join(REPO, "tests", "frontend", "programs.py")
SETUP_TIMEOUT_S = 420.0
PROGRAMS_TIMEOUT_S = 360.0  # both parts take about 10-30 s on a 2-core CPU machine
LOG_TAIL_CHARS = 4000


@pytest.fixture(scope="session")
def frontend_python() -> str:
    """.venv-frontend's python, with sglang==0.4.6.post5's frontend (set up on first use)."""
    try:
        done = subprocess.run(["bash", SETUP_SCRIPT], cwd=REPO, capture_output=True, text=True,
                              timeout=SETUP_TIMEOUT_S)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"scripts/setup_frontend_venv.sh did not finish in {SETUP_TIMEOUT_S:.0f} s "
                    f"(it needs PyPI to install sglang==0.4.6.post5):\n{_text(exc.stderr)}",
                    pytrace=False)
    if done.returncode != 0:
        pytest.fail(f"scripts/setup_frontend_venv.sh failed with exit code {done.returncode} "
                    f"(it needs PyPI to install sglang==0.4.6.post5):\n{done.stdout}{done.stderr}",
                    pytrace=False)
    return FRONTEND_PYTHON


@pytest.fixture(scope="module")
def frontend_server(shared_server: RunningServer, frontend_python: str) -> RunningServer:
    return shared_server  # the run's one default server (tests/conftest.py)


def run_programs(python: str, server: RunningServer, part: str, out: Path) -> dict[str, Any]:
    """Run one part of programs.py against `server`; fail with its output if it wrote nothing."""
    cmd = [python, PROGRAMS, "--url", server.url, "--out", str(out), "--part", part]
    try:
        done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True,
                              timeout=PROGRAMS_TIMEOUT_S)
        output, timed_out = done.stdout + done.stderr, False
    except subprocess.TimeoutExpired as exc:
        output, timed_out = _text(exc.stdout) + _text(exc.stderr), True
    results: dict[str, Any] = {}
    if out.exists():
        results = json.loads(out.read_text())
    if timed_out:
        pytest.fail(f"programs.py --part {part} ran past {PROGRAMS_TIMEOUT_S:.0f} s in section "
                    f"{results.get('running')!r} (finished: {sorted(results.get('sections', {}))})"
                    f"\n--- programs.py output ---\n{output[-LOG_TAIL_CHARS:]}"
                    f"\n--- server log ---\n{server_log_tail(server)}", pytrace=False)
    if not results:
        pytest.fail(f"programs.py --part {part} wrote no results\n{output[-LOG_TAIL_CHARS:]}",
                    pytrace=False)
    if "backend_error" in results:
        pytest.fail("sgl.RuntimeEndpoint(url) failed (GET /get_model_info):\n"
                    f"{results['backend_error']}", pytrace=False)
    results["program_output"] = output
    return results


def server_log_tail(server: RunningServer) -> str:
    return server.log()[-LOG_TAIL_CHARS:]


def _text(value: str | bytes | None) -> str:
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    return value or ""
