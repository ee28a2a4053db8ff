"""scripts/bench_agents.py: a tiny run against the real server (the run's shared one)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from tests.tokenizer.http_helpers import REPO, RunningServer

SCRIPT = os.path.join(REPO, "scripts", "bench_agents.py")


def _bench(server: RunningServer, out: str, *args: str) -> dict:
    cmd = [sys.executable, SCRIPT, "--base-url", server.url, "--output-file", out, "--agents", "2",
           "--turns", "2", "--system-words", "120", "--task-words", "8", "--tool-result-words", "20",
           "--max-tokens", "4", *args]
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    with open(out) as fh:
        return json.loads(fh.readlines()[-1])


def test_chat_turns_report_the_history_served_from_the_cache(shared_server: RunningServer, tmp_path) -> None:
    report = _bench(shared_server, str(tmp_path / "agents.jsonl"), "--mode", "chat")
    first, second = report["per_turn"]
    assert report["failed"] == 0 and first["requests"] == second["requests"] == 2
    assert second["prompt_tokens_mean"] > first["prompt_tokens_mean"]  # the history is resent
    # The second turn resends the first turn's history: most of its prompt is a cache hit.
    assert second["cached_share"] > 0.5, report
    assert first["ttft_p50_s"] > 0 and second["output_tok_s"] > 0


def test_responses_turns_send_only_new_items_and_hit_the_cache(shared_server: RunningServer, tmp_path) -> None:
    report = _bench(shared_server, str(tmp_path / "agents.jsonl"), "--mode", "responses")
    first, second = report["per_turn"]
    assert report["failed"] == 0 and second["requests"] == 2
    # The server rebuilt the history from previous_response_id; its prompt still holds turn 1.
    assert second["prompt_tokens_mean"] > first["prompt_tokens_mean"]
    assert second["cached_share"] > 0.5, report
