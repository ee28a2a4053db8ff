"""Urgent requests under saturation: their TTFT with priority scheduling on, against off, in one run.

For each mode a server is started (`--enable-priority-scheduling` on, then off, else the same
flags), `--low-clients` closed-loop clients keep it saturated with long low-priority requests, and
one client sends a short urgent request (priority 100 when on; no priority when off) every
`--urgent-every` seconds. Prints TTFT p50/p99 of the urgent and the low requests per mode and the
ratio, and writes results/bench_priority-<date>.json.

    .venv/bin/python scripts/bench_priority.py --duration 60 --low-clients 24 --max-running 8
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import os
import subprocess
import sys
import time

import aiohttp
import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from tests.tokenizer.http_helpers import free_port  # noqa: E402


async def one(session: aiohttp.ClientSession, url: str, body: dict) -> float | None:
    """TTFT in seconds of one streamed /generate (None when it failed)."""
    start = time.perf_counter()
    async with session.post(url + "/generate", json={**body, "stream": True}) as resp:
        if resp.status != 200:
            return None
        ttft = None
        async for line in resp.content:
            if ttft is None and line.startswith(b"data: {"):
                ttft = time.perf_counter() - start
        return ttft


async def drive(url: str, args: argparse.Namespace, priority_on: bool) -> dict[str, list[float]]:
    ttfts: dict[str, list[float]] = {"urgent": [], "low": []}
    stop_at = time.monotonic() + args.duration
    low = {"text": "Write a long story about a lighthouse keeper. " * 4,
           "sampling_params": {"max_new_tokens": args.low_tokens, "ignore_eos": True}}
    urgent = {"text": "Say hi.", "sampling_params": {"max_new_tokens": 8, "ignore_eos": True}}
    if priority_on:
        low, urgent = {**low, "priority": 0}, {**urgent, "priority": 100}

    async def low_client(session: aiohttp.ClientSession) -> None:
        while time.monotonic() < stop_at:
            t = await one(session, url, low)
            if t is not None:
                ttfts["low"].append(t)

    async def urgent_client(session: aiohttp.ClientSession) -> None:
        await asyncio.sleep(args.urgent_every)  # let the low requests fill the server first
        while time.monotonic() < stop_at:
            t = await one(session, url, urgent)
            if t is not None:
                ttfts["urgent"].append(t)
            await asyncio.sleep(args.urgent_every)

    timeout = aiohttp.ClientTimeout(total=args.duration + 600)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        await asyncio.gather(urgent_client(session), *(low_client(session) for _ in range(args.low_clients)))
    return ttfts


def serve(args: argparse.Namespace, priority_on: bool) -> tuple[subprocess.Popen, str]:
    port = free_port()
    cmd = [os.path.join(ROOT, ".venv/bin/radixserve"), "serve", "--port", str(port),
           "--max-running-requests", str(args.max_running), *args.server_args.split()]
    if priority_on:
        cmd.append("--enable-priority-scheduling")
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    import requests

    for _ in range(600):
        try:
            if requests.get(url + "/health", timeout=2).status_code == 200:
                return proc, url
        except requests.RequestException:
            pass
        if proc.poll() is not None:
            raise SystemExit(f"the server exited with {proc.returncode}")
        time.sleep(0.5)
    raise SystemExit("the server did not become healthy")


def summary(values: list[float]) -> dict[str, float]:
    arr = np.asarray(values or [float("nan")]) * 1000
    return {"count": len(values), "p50_ms": float(np.percentile(arr, 50)), "p99_ms": float(np.percentile(arr, 99)),
            "max_ms": float(arr.max())}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--duration", type=float, default=60.0, help="seconds of traffic per mode")
    p.add_argument("--low-clients", type=int, default=24)
    p.add_argument("--low-tokens", type=int, default=256)
    p.add_argument("--urgent-every", type=float, default=2.0)
    p.add_argument("--max-running", type=int, default=8)
    p.add_argument("--server-args", default="", help="more radixserve serve flags")
    p.add_argument("--output-dir", default=os.path.join(ROOT, "results"))
    args = p.parse_args()
    report: dict = {"date": datetime.datetime.now().isoformat(timespec="seconds"), "args": vars(args), "modes": {}}
    for priority_on in (True, False):
        proc, url = serve(args, priority_on)
        try:
            ttfts = asyncio.run(drive(url, args, priority_on))
        finally:
            proc.terminate()
            proc.wait(timeout=60)
        mode = "priority" if priority_on else "fcfs"
        report["modes"][mode] = {kind: summary(v) for kind, v in ttfts.items()}
    on, off = report["modes"]["priority"], report["modes"]["fcfs"]
    print(f"{'':22}{'urgent p50':>12}{'urgent p99':>12}{'low p50':>10}{'low p99':>10}{'urgent n':>10}{'low n':>8}")
    for mode, r in report["modes"].items():
        print(f"{mode:22}{r['urgent']['p50_ms']:12.0f}{r['urgent']['p99_ms']:12.0f}{r['low']['p50_ms']:10.0f}"
              f"{r['low']['p99_ms']:10.0f}{r['urgent']['count']:10d}{r['low']['count']:8d}")
    print(f"urgent p99, priority / fcfs: {on['urgent']['p99_ms'] / off['urgent']['p99_ms']:.2f}")
    os.makedirs(args.output_dir, exist_ok=True)
    path = os.path.join(args.output_dir, f"bench_priority-{time.strftime('%Y%m%d-%H%M%S')}.json")
    with open(path, "w") as fh:
        json.dump(report, fh, indent=2)
    print(f"results: {path}")


if __name__ == "__main__":
    main()
