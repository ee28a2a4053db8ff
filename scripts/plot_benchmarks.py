"""Turn benchmark results into PNGs for docs/benchmarks.md (matplotlib: `pip install -e '.[bench]'`).

    .venv/bin/python scripts/plot_benchmarks.py --peers results/bench_peers-<date>.json
    .venv/bin/python scripts/plot_benchmarks.py --agents results/bench_agents.jsonl
    .venv/bin/python scripts/plot_benchmarks.py --serving results/bench_serving.jsonl \
        --offline results/bench_offline.jsonl --out docs/img

From a `scripts/bench_peers.sh` run (its JSON and the per-run vLLM result files it names):
  peers_throughput.png   output tok/s per system, one group of bars per workload
  peers_ttft.png         the distribution of TTFT per system and workload (box plots)
  peers_tpot.png         the same for TPOT (each request's mean time per output token)
  peers_concurrency.png  output tok/s against concurrency (the random 256/128 workloads c1, c4,
                         c16, c64 that were measured)
From bench_serving.py / bench_offline.py JSON lines: serving_throughput.png (output tok/s per
labelled run) and offline_throughput.png (output tok/s per workload and engine).
"""

from __future__ import annotations

import argparse
import json
import os
from collections import defaultdict
from typing import Any

CONCURRENCY_WORKLOADS = {"c1": 1, "c4": 4, "c16": 16, "c64": 64}


def _plt() -> Any:
    try:
        import matplotlib
    except ImportError:
        raise SystemExit("matplotlib is missing: pip install -e '.[bench]' (or pip install matplotlib)") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def load_peers(path: str) -> dict[str, Any]:
    with open(path) as fh:
        return json.load(fh)


def _ok_runs(report: dict[str, Any]) -> list[dict[str, Any]]:
    return [r for r in report["runs"] if r.get("status") == "ok" and r.get("metrics")]


def _title(report: dict[str, Any], what: str) -> str:
    cpu = report.get("cpu", {})
    flags = [f for f, on in (cpu.get("flags") or {}).items() if on]
    name = f"{cpu.get('Model name', 'CPU')}, {cpu.get('nproc', '?')} cores ({' '.join(flags)})"
    return f"{what}\n{name}, {str(report.get('date', ''))[:16]}; * = runs with failed requests"


def _detailed(run: dict[str, Any]) -> dict[str, Any] | None:
    try:
        with open(run["result_file"]) as fh:
            return json.load(fh)
    except (OSError, KeyError, ValueError):
        return None


def _tpots(detail: dict[str, Any]) -> list[float]:
    """Each request's mean time per output token after the first (ms)."""
    out = []
    for lat, ttft, n in zip(detail.get("latencies", []), detail.get("ttfts", []), detail.get("output_lens", [])):
        if n and n > 1 and lat and ttft is not None:
            out.append((lat - ttft) / (n - 1) * 1000)
    return out


def plot_peer_throughput(report: dict[str, Any], out: str) -> str:
    plt = _plt()
    runs = _ok_runs(report)
    workloads = [w for w in ("c1", "c4", "c16", "c64", "prefix") if any(r["workload"] == w for r in runs)]
    systems = list(dict.fromkeys(r["label"] for r in runs))
    value = {(r["label"], r["workload"]): r["metrics"]["output_throughput"] for r in runs}
    unclean = {(r["label"], r["workload"]) for r in runs if r.get("problems")}
    fig, ax = plt.subplots(figsize=(max(6, 1.8 * len(workloads) + 2), 4.2))
    width = 0.8 / max(len(systems), 1)
    for i, system in enumerate(systems):
        xs = [j + i * width for j in range(len(workloads))]
        ys = [value.get((system, w), 0.0) for w in workloads]
        bars = ax.bar(xs, ys, width, label=system)
        marks = [f"{y:.0f}" + ("*" if (system, w) in unclean else "") for y, w in zip(ys, workloads)]
        ax.bar_label(bars, labels=marks, fontsize=7)
    ax.set_xticks([j + width * (len(systems) - 1) / 2 for j in range(len(workloads))], workloads)
    ax.set_ylabel("output tokens/s")
    ax.set_title(_title(report, "Output throughput, same client (vllm bench serve)"), fontsize=9)
    ax.legend(fontsize=7)
    return _save(fig, out, "peers_throughput.png")


def plot_peer_latency(report: dict[str, Any], out: str, metric: str) -> str:
    """Box plots of TTFT or TPOT per system, one panel per workload."""
    plt = _plt()
    runs = _ok_runs(report)
    workloads = list(dict.fromkeys(r["workload"] for r in runs))
    cols = min(3, len(workloads))
    rows = -(-len(workloads) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(5 * cols, 4 * rows), squeeze=False)
    for ax in axes.flat[len(workloads):]:
        ax.set_visible(False)
    for ax, workload in zip(axes.flat, workloads):
        labels, data = [], []
        for run in (r for r in runs if r["workload"] == workload):
            detail = _detailed(run)
            if detail is None:
                continue
            values = [t * 1000 for t in detail.get("ttfts", []) if t] if metric == "ttft" else _tpots(detail)
            if values:
                labels.append(run["label"].replace(" ", "\n", 1))
                data.append(values)
        if data:
            ax.boxplot(data, showfliers=False)
            ax.set_xticks(range(1, len(labels) + 1), labels, fontsize=6, rotation=20)
        ax.set_title(workload, fontsize=9)
        ax.set_ylabel(f"{metric.upper()} ms")
    fig.suptitle(_title(report, f"{metric.upper()} per request (box: quartiles, whiskers 1.5 IQR)"), fontsize=9)
    return _save(fig, out, f"peers_{metric}.png")


def plot_peer_concurrency(report: dict[str, Any], out: str) -> str | None:
    runs = [r for r in _ok_runs(report) if r["workload"] in CONCURRENCY_WORKLOADS]
    if len({r["workload"] for r in runs}) < 2:
        return None
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    by_system: dict[str, list[tuple[int, float]]] = defaultdict(list)
    for r in runs:
        by_system[r["label"]].append((CONCURRENCY_WORKLOADS[r["workload"]], r["metrics"]["output_throughput"]))
    for system, points in by_system.items():
        points.sort()
        ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=system)
    ax.set_xscale("log", base=2)
    ax.set_xticks(sorted(CONCURRENCY_WORKLOADS.values()), [str(c) for c in sorted(CONCURRENCY_WORKLOADS.values())])
    ax.set_xlabel("concurrency (random 256 in / 128 out)")
    ax.set_ylabel("output tokens/s")
    ax.set_title(_title(report, "Throughput against concurrency"), fontsize=9)
    ax.legend(fontsize=7)
    return _save(fig, out, "peers_concurrency.png")


def _jsonl(path: str) -> list[dict[str, Any]]:
    with open(path) as fh:
        return [json.loads(line) for line in fh if line.strip()]


def plot_serving(path: str, out: str) -> str:
    plt = _plt()
    rows = _jsonl(path)
    labels = [r.get("label") or f"{r['dataset']} c{r['max_concurrency']}" for r in rows]
    fig, ax = plt.subplots(figsize=(max(6, 0.9 * len(rows) + 2), 4))
    bars = ax.bar(range(len(rows)), [r["output_throughput"] for r in rows])
    ax.bar_label(bars, fmt="%.0f", fontsize=7)
    ax.set_xticks(range(len(rows)), labels, rotation=30, ha="right", fontsize=7)
    ax.set_ylabel("output tokens/s")
    ax.set_title("bench_serving.py runs", fontsize=9)
    return _save(fig, out, "serving_throughput.png")


def plot_offline(path: str, out: str) -> str:
    plt = _plt()
    rows = [r for r in _jsonl(path) if "output_tok_s" in r or "output_throughput" in r]
    labels = [f"{r.get('workload')}: {r.get('engine', r.get('label', ''))}" for r in rows]
    values = [r.get("output_tok_s", r.get("output_throughput", 0.0)) for r in rows]
    fig, ax = plt.subplots(figsize=(max(6, 0.9 * len(rows) + 2), 4))
    bars = ax.bar(range(len(rows)), values)
    ax.bar_label(bars, fmt="%.0f", fontsize=7)
    ax.set_xticks(range(len(rows)), labels, rotation=30, ha="right", fontsize=7)
    ax.set_ylabel("output tokens/s")
    ax.set_title("bench_offline.py runs", fontsize=9)
    return _save(fig, out, "offline_throughput.png")


def plot_agents(path: str, out: str) -> str:
    """bench_agents.py runs: TTFT p50 and the cached share of the prompt, turn by turn, per run."""
    plt = _plt()
    rows = _jsonl(path)
    fig, (ttft_ax, cached_ax) = plt.subplots(1, 2, figsize=(10, 4))
    for r in rows:
        turns = [t["turn"] for t in r["per_turn"]]
        ttft_ax.plot(turns, [t["ttft_p50_s"] for t in r["per_turn"]], marker="o", label=r["label"])
        cached_ax.plot(turns, [t["cached_share"] or 0.0 for t in r["per_turn"]], marker="o", label=r["label"])
    ttft_ax.set_xlabel("turn")
    ttft_ax.set_ylabel("TTFT p50 (s)")
    cached_ax.set_xlabel("turn")
    cached_ax.set_ylabel("cached share of the prompt")
    ttft_ax.legend(fontsize=7)
    fig.suptitle("bench_agents.py runs", fontsize=9)
    return _save(fig, out, "agents_turns.png")


def _save(fig: Any, out: str, name: str) -> str:
    os.makedirs(out, exist_ok=True)
    path = os.path.join(out, name)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    import matplotlib.pyplot as plt

    plt.close(fig)
    return path


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--peers", help="a results/bench_peers-<date>.json")
    p.add_argument("--serving", help="bench_serving.py JSON lines")
    p.add_argument("--offline", help="bench_offline.py JSON lines")
    p.add_argument("--agents", help="bench_agents.py JSON lines")
    p.add_argument("--out", default="docs/img", help="folder for the PNGs")
    args = p.parse_args()
    if not (args.peers or args.serving or args.offline or args.agents):
        p.error("give at least one of --peers, --serving, --offline, --agents")
    written: list[str] = []
    if args.peers:
        report = load_peers(args.peers)
        written += [plot_peer_throughput(report, args.out), plot_peer_latency(report, args.out, "ttft"),
                    plot_peer_latency(report, args.out, "tpot")]
        sweep = plot_peer_concurrency(report, args.out)
        written += [sweep] if sweep else []
    if args.serving:
        written.append(plot_serving(args.serving, args.out))
    if args.offline:
        written.append(plot_offline(args.offline, args.out))
    if args.agents:
        written.append(plot_agents(args.agents, args.out))
    for path in written:
        print(path)


if __name__ == "__main__":
    main()
