"""scripts/serve_replicas.sh: two replicas of the default model behind the real sglang-router.

One module-wide run of the script (cache_aware router) plus a round_robin router that the test
starts in front of the same two replicas (retries off, so a failed request shows as failed):
- a shared-prefix workload answers every request and hits the prefix caches more through
  cache_aware than through round_robin (the caches are flushed between the runs);
- a replica SIGKILLed while requests are in flight: through round_robin, the survivor's requests
  answer in full and the dead one's end with an error (not a timeout), then both routers serve
  from the survivor;
- SIGTERM to the script stops the router and the replicas, process groups included (last).

Why cache_aware must win, whatever the arrival order within a wave: see `_run_workload`.
"""

from __future__ import annotations

import os
import random
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import requests

from tests.tokenizer.http_helpers import BASE_ARGS, REPO, wait_until

pytestmark = pytest.mark.slow

SCRIPT = os.path.join(REPO, "scripts", "serve_replicas.sh")
# Health checks every second, two failures in a row to drop a worker: a dead replica leaves within
# a few seconds, and one slow /health on a busy CI machine (5 s timeout) does not drop a live one.
HEALTH = ("--health-check-interval-secs", "1", "--health-failure-threshold", "2",
          "--health-check-timeout-secs", "5")
# cache_aware's rules, stated rather than left to the defaults: route by the longest cached prefix
# when it covers more than 30% of the text, and switch to the least-loaded worker only when the
# loads differ by more than 64 requests and by 1.5x. The workload never has more than 3 requests
# in flight, so load balancing never overrides the cache.
CACHE_AWARE = ("--cache-threshold", "0.3", "--balance-abs-threshold", "64",
               "--balance-rel-threshold", "1.5")
GROUPS, PER_GROUP = 3, 4
# Words of each group's system prompt (a word of WORDS is at least one token). What the cache
# test proves needs the prompt to be mostly system prompt, not long: every missed prefix is a
# full prefill on a one-thread replica, so 120 words rather than 400.
SYSTEM_WORDS = 120
WORDS = ("river stone cloud garden engine lantern copper meadow harbor violin pepper canyon orbit "
         "marble falcon tunnel velvet island ladder candle anchor forest signal bridge").split()


def _free_port_block(n: int) -> int:
    """A base port with base .. base+n-1 all free on 127.0.0.1 (the script's port layout)."""
    rng = random.Random()
    for _ in range(200):
        base = rng.randrange(20000, 60000)
        try:
            for port in range(base, base + n):
                with socket.socket() as s:
                    s.bind(("127.0.0.1", port))
        except OSError:
            continue
        return base
    raise RuntimeError(f"no {n} consecutive free ports")


@dataclass
class Replicas:
    """The running script: its router, its replicas' URLs and pids, and its output file."""

    process: subprocess.Popen[bytes]
    router: str
    urls: list[str]
    pids: list[int]
    out: Path

    def output(self) -> str:
        return self.out.read_text(errors="replace")


def _start_script(tmp: Path, port: int, model_path: str) -> Replicas:
    out = tmp / "script.out"
    router_args = " ".join(HEALTH + CACHE_AWARE)
    cmd = ["bash", SCRIPT, "-n", "2", "--port", str(port), "--log-dir", str(tmp / "logs"),
           "--router-args", router_args, "--", "--model-path", model_path, *BASE_ARGS]
    with open(out, "wb") as fh:
        process = subprocess.Popen(cmd, cwd=REPO, stdout=fh, stderr=subprocess.STDOUT,
                                   stdin=subprocess.DEVNULL)
    deadline = time.monotonic() + 240
    while "ready:" not in out.read_text(errors="replace"):
        assert process.poll() is None, f"script exited {process.returncode}:\n{_logs(tmp, out)}"
        assert time.monotonic() < deadline, f"script not ready in 240 s:\n{_logs(tmp, out)}"
        time.sleep(0.25)
    text = out.read_text()
    replicas = re.findall(r"^replica \d+: (http://\S+) \(pid (\d+)\)$", text, re.M)
    assert len(replicas) == 2, text
    return Replicas(process, f"http://127.0.0.1:{port}", [u for u, _ in replicas],
                    [int(p) for _, p in replicas], out)


def _logs(tmp: Path, out: Path) -> str:
    parts = [out.read_text(errors="replace")]
    for log in sorted((tmp / "logs").glob("*.log")):
        parts.append(f"--- {log.name}\n" + log.read_text(errors="replace")[-3000:])
    return "\n".join(parts)


def _start_router(tmp: Path, policy: str,
                  workers: list[str]) -> tuple[subprocess.Popen[bytes], str]:
    port = _free_port_block(1)
    cmd = [sys.executable, "-m", "sglang_router.launch_router", "--host", "127.0.0.1",
           "--port", str(port), "--worker-urls", *workers, "--policy", policy,
           "--prometheus-host", "127.0.0.1", "--prometheus-port", str(_free_port_block(1)),
           "--shutdown-grace-period-secs", "5", "--disable-retries", *HEALTH]
    with open(tmp / f"router-{policy}.log", "wb") as log:
        process = subprocess.Popen(cmd, cwd=REPO, stdout=log, stderr=subprocess.STDOUT,
                                   stdin=subprocess.DEVNULL, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    wait_until(lambda: process.poll() is not None or _healthy_workers(url) == len(workers),
               f"the {policy} router to count its workers", timeout=60)
    assert process.poll() is None, (tmp / f"router-{policy}.log").read_text()
    return process, url


def _healthy_workers(router: str) -> int:
    try:
        return int(requests.get(router + "/readiness", timeout=5).json().get("healthy_workers", 0))
    except (requests.RequestException, ValueError):
        return 0


def _stop(process: subprocess.Popen[bytes], timeout: float = 60) -> int:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)
    return process.returncode


@pytest.fixture(scope="module")
def replicas(default_model_path: str,
             tmp_path_factory: pytest.TempPathFactory) -> Iterator[Replicas]:
    tmp = tmp_path_factory.mktemp("replicas")
    running = _start_script(tmp, _free_port_block(4), default_model_path)
    yield running
    _stop(running.process)


@pytest.fixture(scope="module")
def round_robin(replicas: Replicas, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    process, url = _start_router(tmp_path_factory.mktemp("rr"), "round_robin", replicas.urls)
    yield url
    _stop(process)


def _system_prompt(group: int) -> str:
    """About SYSTEM_WORDS tokens; groups differ from their third word, so no two share a cached
    prefix."""
    rng = random.Random(group)
    return f"Group {group} rules. " + " ".join(rng.choice(WORDS) for _ in range(SYSTEM_WORDS))


def _prompt(group: int, i: int) -> str:
    return f"{_system_prompt(group)}\n\nQuestion {i}: what is word {i * 7 + group}?\nAnswer:"


def _generate(url: str, text: str, max_new_tokens: int = 4, timeout: float = 120) -> dict[str, Any]:
    body = {"text": text, "sampling_params": {"max_new_tokens": max_new_tokens, "temperature": 0,
                                              "ignore_eos": True}}
    resp = requests.post(url + "/generate", json=body, timeout=timeout)
    assert resp.status_code == 200, resp.text
    meta = resp.json()["meta_info"]
    assert meta["completion_tokens"] == max_new_tokens, meta
    return dict(meta)


def _run_workload(router: str) -> int:
    """Summed cached_tokens of GROUPS x PER_GROUP shared-prefix prompts sent through `router`.

    Wave 0 sends each group's first prompt, one at a time; each later wave sends one prompt of
    every group at once. So a prompt never races its group's first one to the cache.
    cache_aware sends every later prompt to the worker that served its group's first, which then
    has the prefix: all GROUPS * (PER_GROUP - 1) of them hit it. round_robin hands the 12 requests
    12 consecutive turns, 6 per worker: a group that stays on one worker takes 4 of one worker's
    turns, and 6 is no sum of 4s, so some group reaches both workers and misses once more, in any
    arrival order within a wave. The KV pools (8192 tokens each) hold every prefix: no eviction.
    """
    cached = sum(_generate(router, _prompt(g, 0))["cached_tokens"] for g in range(GROUPS))
    with ThreadPoolExecutor(GROUPS) as pool:
        for i in range(1, PER_GROUP):
            metas = list(pool.map(lambda g, i=i: _generate(router, _prompt(g, i)), range(GROUPS)))
            cached += sum(m["cached_tokens"] for m in metas)
    return cached


def _flush(urls: list[str]) -> None:
    for url in urls:
        wait_until(lambda u=url: requests.post(u + "/flush_cache", timeout=30).status_code == 200,
                   f"an idle {url} to flush its cache", timeout=30)


def test_cache_aware_hits_the_prefix_cache_more_than_round_robin(
        replicas: Replicas, round_robin: str) -> None:
    _flush(replicas.urls)
    cache_aware = _run_workload(replicas.router)
    _flush(replicas.urls)
    rr = _run_workload(round_robin)
    # At least one full system prompt (SYSTEM_WORDS tokens or more) per later prompt of every
    # group, less a margin of 1/8.
    assert cache_aware >= GROUPS * (PER_GROUP - 1) * SYSTEM_WORDS * 7 // 8, (cache_aware, rr)
    assert cache_aware > rr, (cache_aware, rr)


def _running(url: str) -> int:
    try:
        info = requests.get(url + "/get_server_info", timeout=5).json()
    except (requests.RequestException, ValueError):
        return 0
    return int(info["internal_states"][0]["running"])


# Long enough that a story is still decoding when the kill lands, right after both replicas
# were seen running (a decode step takes tens of ms on a one-thread replica).
STORY_TOKENS = 64


def _story(url: str, i: int, timeout: float = 300) -> str:
    """One request's outcome: "full" (200 with all STORY_TOKENS), "HTTP <status>: <body>",
    "error <exception>" or "client timeout" (the timeout only bounds a hang)."""
    body = {"text": f"Story {i}: once upon a time",
            "sampling_params": {"max_new_tokens": STORY_TOKENS, "temperature": 0, "ignore_eos": True}}
    try:
        resp = requests.post(url + "/generate", json=body, timeout=timeout)
    except requests.Timeout:
        return "client timeout"
    except requests.RequestException as exc:
        return f"error {type(exc).__name__}"
    if resp.status_code != 200:
        return f"HTTP {resp.status_code}: {resp.text[:200]}"
    meta = resp.json()["meta_info"]
    full = meta["completion_tokens"] == STORY_TOKENS and meta["finish_reason"]["type"] == "length"
    return "full" if full else f"HTTP 200 but {meta}"


def _quick_error(outcome: str) -> bool:
    """An error the router or the connection gave, not a timeout of either (408, 504)."""
    return outcome.startswith("error ") or (outcome.startswith("HTTP 5") and not outcome.startswith("HTTP 504"))


def test_killing_a_replica_ends_every_request_and_the_other_keeps_serving(
        replicas: Replicas, round_robin: str) -> None:
    """round_robin gives each replica three requests; the second is SIGKILLed while both decode.
    The survivor's three answer in full; the dead one's end with an error (this router does not
    retry them elsewhere), never a timeout and never a cut-short 200: at least the one that was
    running when it died (the others may have finished just before)."""
    outcomes: dict[int, str] = {}
    threads = [threading.Thread(target=lambda i=i: outcomes.update({i: _story(round_robin, i)}), daemon=True)
               for i in range(6)]
    for t in threads:
        t.start()
    wait_until(lambda: all(_running(u) > 0 for u in replicas.urls), "both replicas running",
               timeout=60)
    os.kill(replicas.pids[1], signal.SIGKILL)
    for t in threads:
        t.join(330)
    assert not any(t.is_alive() for t in threads), f"requests still hanging: {outcomes}"
    print("outcomes:", outcomes)
    assert len(outcomes) == 6, outcomes
    full = [o for o in outcomes.values() if o == "full"]
    assert all(o == "full" or _quick_error(o) for o in outcomes.values()), outcomes
    assert 3 <= len(full) < 6, outcomes
    # The routers drop the dead worker after a few health checks, then serve from the other.
    for router in (round_robin, replicas.router):
        wait_until(lambda r=router: _healthy_workers(r) == 1, f"{router} to drop the dead replica")
        for i in range(4):
            _generate(router, f"After the crash, request {i}:")
    wait_until(lambda: "replica 2 (pid" in replicas.output(), "the script to report the death")


def _group_members(pgid: int) -> list[int]:
    members = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        # pid (comm) state ppid pgrp ...: comm may hold spaces, so split after its ')'. Zombies
        # do not count: orphans are reparented to an init that may not reap them.
        state, _ppid, pgrp = stat.rsplit(")", 1)[1].split()[:3]
        if int(pgrp) == pgid and state != "Z":
            members.append(int(entry))
    return members


def test_sigterm_stops_the_router_and_the_replicas(replicas: Replicas) -> None:
    router_pid = int(re.search(r"^router: .*pid (\d+)\)$", replicas.output(), re.M).group(1))
    assert _stop(replicas.process) == 0, replicas.output()
    for pgid in (router_pid, *replicas.pids):
        assert _group_members(pgid) == [], f"process group {pgid} left running"
    for url in (replicas.router, *replicas.urls):
        with pytest.raises(requests.ConnectionError):
            requests.get(url + "/health", timeout=5)
