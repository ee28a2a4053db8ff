"""scripts/bench_serving.py: a tiny run of each backend against the real server."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.tokenizer.http_helpers import REPO, RunningServer

pytestmark = pytest.mark.slow

SCRIPT = os.path.join(REPO, "scripts", "bench_serving.py")
KEYS = {"completed", "failed", "duration_s", "total_input_tokens", "total_output_tokens",
        "total_cached_tokens", "cache_hit_rate", "request_throughput", "input_throughput", "output_throughput",
        "mean_ttft_ms", "median_ttft_ms", "p90_ttft_ms", "p99_ttft_ms", "mean_itl_ms",
        "p99_itl_ms", "mean_tpot_ms", "mean_e2e_latency_ms", "p99_e2e_latency_ms", "args"}


@pytest.fixture
def server(shared_server: RunningServer) -> RunningServer:
    return shared_server  # the run's one default server (tests/conftest.py)


def _bench(server: RunningServer, out: str, *args: str) -> dict:
    cmd = [sys.executable, SCRIPT, "--base-url", server.url, "--output-file", out,
           "--disable-tqdm", *args]
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Serving Benchmark Result" in done.stdout
    with open(out) as fh:
        return json.loads(fh.readlines()[-1])


def test_random_openai_and_shared_prefix_native(server: RunningServer, tmp_path) -> None:
    out = str(tmp_path / "bench.jsonl")
    report = _bench(server, out, "--backend", "openai", "--num-prompts", "4",
                    "--random-input-len", "16", "--random-output-len", "4",
                    "--random-range-ratio", "1", "--max-concurrency", "2")
    assert set(report) >= KEYS and report["completed"] == 4 and report["failed"] == 0
    assert report["total_input_tokens"] == 64 and report["total_output_tokens"] == 16
    assert report["mean_ttft_ms"] > 0 and report["mean_itl_ms"] > 0
    report = _bench(server, out, "--backend", "native", "--dataset", "generated-shared-prefix",
                    "--gsp-num-groups", "1", "--gsp-prompts-per-group", "3",
                    "--gsp-system-prompt-len", "64", "--gsp-question-len", "4",
                    "--gsp-output-len", "3", "--request-rate", "20", "--warmup-requests", "0")
    assert report["completed"] == 3 and report["total_output_tokens"] == 9
    assert report["total_cached_tokens"] >= 64  # later prompts reuse the shared system prompt
    with open(out) as fh:
        assert len(fh.readlines()) == 2


def test_refuses_a_remote_url() -> None:
    done = subprocess.run([sys.executable, SCRIPT, "--base-url", "http://example.com"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode != 0 and "loopback" in done.stderr
