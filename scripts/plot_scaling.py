"""Draw docs/img/scaling.png from a bench_tp.sh and a bench_router.sh result (matplotlib: the `bench` extra).

    .venv/bin/python scripts/plot_scaling.py --tp results/bench_tp-<date>.json \
        --router results/bench_router-<date>.json [--router results/bench_router-<date2>.json] --out docs/img

Left: output tok/s of each tensor-parallel size per workload. Right: output tok/s of the replica
runs (direct, router + one, router + two) per router policy, with each run's cache hit rate.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from plot_benchmarks import _plt, _save  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--tp", required=True, help="a results/bench_tp-<date>.json")
    p.add_argument("--router", action="append", required=True, help="a results/bench_router-<date>.json (repeatable)")
    p.add_argument("--out", default="docs/img")
    args = p.parse_args()
    plt = _plt()
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    tp = json.loads(Path(args.tp).read_text())["runs"]
    sizes = sorted({name.split("-")[0] for name in tp})
    for i, size in enumerate(sizes):
        values = [tp[f"{size}-{w}"]["output_throughput"] for w in ("c1", "c16")]
        left.bar([x + i * 0.35 for x in range(2)], values, width=0.35, label=size.replace("tp", "tp "))
    left.set_xticks([x + 0.175 for x in range(2)], ["c1", "c16"])
    left.set(title="tensor parallelism (2 CPU cores)", ylabel="output tok/s")
    left.legend()
    labels, values, rates = [], [], []
    for path in args.router:
        report = json.loads(Path(path).read_text())
        for run, name in (("direct", "direct"), ("1", "router+1"), ("2", "router+2")):
            if run == "direct" and labels and labels[0].startswith("direct"):
                continue  # one direct bar is enough
            r = report["runs"][run]
            labels.append(name if run == "direct" else f"{name}\n{report['policy']}")
            values.append(r["output_throughput"])
            rates.append(r["cache_hit_rate"])
    bars = right.bar(range(len(values)), values)
    for bar, rate in zip(bars, rates):
        right.annotate(f"hit {rate:.2f}", (bar.get_x() + bar.get_width() / 2, bar.get_height()), ha="center",
                       va="bottom", fontsize=8)
    right.set_xticks(range(len(labels)), labels, fontsize=8)
    right.set(title="replicas behind sglang-router (shared prefixes)", ylabel="output tok/s")
    print(_save(fig, args.out, "scaling.png"))


if __name__ == "__main__":
    main()
