#!/usr/bin/env python3
"""The bookkeeping half of scripts/bench_peers.sh (standard library only).

  peers_table.py add --manifest RUNS.jsonl --system S --label L --workload W --status ok \\
      [--result FILE] [--server-cmd C] [--bench-cmd C] [--server-log F] [--bench-log F] [--error E]
      appends one run (one system on one workload) to the manifest.
  peers_table.py report --manifest RUNS.jsonl --out OUT.json [--baseline radixserve] [--meta K=V ...]
      reads every run's `vllm bench serve` result file, writes everything as one JSON file (the
      date, the CPU, the commands, the versions, the numbers) and prints the markdown tables: one
      row per system, per workload its output tok/s, median TTFT and median TPOT; then the
      baseline's ratios to each peer. A run of scripts/bench_agents.py (the `agents` workload)
      gives its `summary` in the same units, and its turns get a table of their own.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import re
import statistics
import subprocess
import sys

WORKLOAD_TITLES = {
    "c16": "random 256/128, c=16",
    "c1": "random 256/128, c=1",
    "prefix": "prefix 1024+128/32, c=16",
    "c4": "random 256/128, c=4",
    "c64": "random 256/128, c=64",
    "agents": "agents 8x4 turns, chat",
}
NOISY_FRACTION = 0.05  # other processes' share of the machine's CPU above which a run is flagged
CPU_FLAGS_OF_INTEREST = ("avx2", "avx512f", "avx512bw", "avx512_vnni", "avx512_bf16", "avx512_fp16", "amx_bf16",
                         "amx_tile")

# What is kept from each vLLM result file (the per-request arrays stay in the raw file).
KEPT_METRICS = (
    "completed",
    "failed",
    "num_prompts",
    "max_concurrency",
    "duration",
    "total_input_tokens",
    "total_output_tokens",
    "request_throughput",
    "output_throughput",
    "total_token_throughput",
    "mean_ttft_ms",
    "median_ttft_ms",
    "p99_ttft_ms",
    "mean_tpot_ms",
    "median_tpot_ms",
    "p99_tpot_ms",
    "mean_itl_ms",
    "median_itl_ms",
    "p99_itl_ms",
    "mean_e2el_ms",
    "median_e2el_ms",
    "p99_e2el_ms",
)


def cmd_add(args: argparse.Namespace) -> None:
    run = {
        "system": args.system,
        "label": args.label,
        "workload": args.workload,
        "status": args.status,
        "result_file": args.result,
        "server_cmd": args.server_cmd,
        "bench_cmd": args.bench_cmd,
        "server_log": args.server_log,
        "bench_log": args.bench_log,
        "error": args.error,
        "loadavg_before": args.loadavg_before,
    }
    with open(args.manifest, "a") as f:
        f.write(json.dumps(run) + "\n")


def _proc_stat() -> tuple[float, float]:
    """(busy, steal) CPU-seconds of the whole machine since boot, from /proc/stat."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    user, nice, system, _idle, _iowait, irq, softirq, steal = (fields + [0] * 8)[:8]
    tick = os.sysconf("SC_CLK_TCK")
    return (user + nice + system + irq + softirq) / tick, steal / tick


def _group_cpu(pgid: int) -> float:
    """CPU-seconds used so far by the processes of process group `pgid` (and their reaped children)."""
    total = 0
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                rest = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        # rest[0] is field 3 (state): pgrp is field 5, utime..cstime are fields 14-17.
        if int(rest[2]) == pgid:
            total += sum(int(x) for x in rest[11:15])
    return total / os.sysconf("SC_CLK_TCK")


def cmd_measure(args: argparse.Namespace) -> int:
    """Run the benchmark command and account for the machine's CPU meanwhile: the server's
    process group, the client, and everything else (which should be about zero on a quiet machine)."""
    import resource
    import time

    cmd = args.command[1:] if args.command and args.command[0] == "--" else args.command
    busy0, steal0 = _proc_stat()
    group0 = _group_cpu(args.server_pgid)
    kids0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.monotonic()
    rc = subprocess.call(cmd)
    wall = time.monotonic() - t0
    kids1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    group1 = _group_cpu(args.server_pgid)
    busy1, steal1 = _proc_stat()
    client = (kids1.ru_utime - kids0.ru_utime) + (kids1.ru_stime - kids0.ru_stime)
    server = group1 - group0
    busy = busy1 - busy0
    acct = {
        "wall_s": round(wall, 2),
        "ncpu": os.cpu_count(),
        "machine_busy_cpu_s": round(busy, 2),
        "server_cpu_s": round(server, 2),
        "client_cpu_s": round(client, 2),
        "other_cpu_s": round(max(0.0, busy - server - client), 2),
        "steal_s": round(steal1 - steal0, 2),
    }
    acct["other_cpu_frac"] = round(acct["other_cpu_s"] / max(wall * (os.cpu_count() or 1), 1e-9), 3)
    with open(args.out, "w") as f:
        json.dump(acct, f, indent=2)
    return rc


def cpu_info() -> dict:
    info: dict = {"nproc": os.cpu_count()}
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=False).stdout
        for line in out.splitlines():
            key, _, value = line.partition(":")
            if key.strip() in ("Model name", "CPU family", "Model", "Thread(s) per core", "Core(s) per socket"):
                info[key.strip()] = value.strip()
    except OSError:
        pass
    flags: set[str] = set()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    flags = set(line.split(":", 1)[1].split())
                    break
    except OSError:
        pass
    info["flags"] = {name: name in flags for name in CPU_FLAGS_OF_INTEREST}
    try:
        with open("/proc/meminfo") as f:
            kb = int(re.search(r"MemTotal:\s+(\d+)", f.read()).group(1))
        info["memory_gib"] = round(kb / 2**20, 1)
    except (OSError, AttributeError):
        pass
    return info


def percentile(values: list[float], q: float) -> float:
    """numpy.percentile's default (linear interpolation)."""
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def recount(res: dict, wanted: int) -> dict | None:
    """Output-token metrics recomputed with `wanted` tokens per request, or None if not justified.

    vLLM's client takes a request's token count from the streamed `usage`, but only from a chunk
    without `choices`. llama-server sends `usage` in its last chunk together with an empty
    choice, so the client falls back to re-tokenizing the generated text with the HF tokenizer,
    which undercounts (special tokens such as <|im_end|>, generated once EOS is ignored, stream as
    empty text). With ignore_eos and max_tokens=wanted the server generates exactly `wanted`
    tokens, and the stream proves it: llama-server sends one chunk per token plus that final one,
    so a request whose stream had at least `wanted` chunks after the first (len(itls) >= wanted - 1,
    the same number vLLM's and radixserve's streams give) produced all of them. Only then are the
    throughput and TPOT recomputed the way vLLM's client computes them; TTFT is unchanged.
    """
    lens = res.get("output_lens") or []
    itls = res.get("itls") or []
    ttfts = res.get("ttfts") or []
    lats = res.get("latencies") or []
    errors = res.get("errors") or [""] * len(lens)
    if not (lens and len(itls) == len(lens) == len(ttfts) == len(lats)) or wanted <= 1:
        return None
    ok = [i for i in range(len(lens)) if lens[i] and not errors[i]]
    if not ok or any(len(itls[i]) < wanted - 1 or lens[i] > wanted for i in ok):
        return None
    tpots = [(lats[i] - ttfts[i]) / (wanted - 1) * 1000 for i in ok]
    total = wanted * len(ok)
    return {
        "total_output_tokens": total,
        "output_throughput": total / res["duration"],
        "total_token_throughput": (total + (res.get("total_input_tokens") or 0)) / res["duration"],
        "mean_tpot_ms": statistics.fmean(tpots),
        "median_tpot_ms": statistics.median(tpots),
        "p99_tpot_ms": percentile(tpots, 99),
    }


def load_run(run: dict) -> dict:
    """The run with its kept metrics, and checks that every request finished in full."""
    run = dict(run)
    path = run.get("result_file")
    if not path or not os.path.exists(path):
        if run["status"] == "ok":
            run["status"] = "no-result"
        return run
    with open(path) as f:
        res = json.load(f)
    cpu_file = path[: -len(".json")] + ".cpu.json"
    if os.path.exists(cpu_file):
        with open(cpu_file) as f:
            run["cpu_accounting"] = json.load(f)
    if "per_turn" in res:  # scripts/bench_agents.py's record, not vLLM's
        return _agents_run(run, res)
    run["metrics"] = {k: res.get(k) for k in KEPT_METRICS if k in res}
    problems = []
    if res.get("failed"):
        problems.append(f"{res['failed']} of {res.get('num_prompts')} requests failed")
    errors = [e for e in res.get("errors") or [] if e]
    if errors:
        distinct = sorted(set(e.strip()[-400:] for e in errors))
        run["errors"] = distinct[:5]
    lens = [n for n in res.get("output_lens") or [] if n is not None]
    wanted_m = re.search(r"--random-output-len (\d+)", run.get("bench_cmd") or "")
    if lens and wanted_m:
        wanted = int(wanted_m.group(1))
        run["client_output_lens"] = {"min": min(lens), "max": max(lens), "mean": statistics.fmean(lens)}
        if min(lens) != wanted or max(lens) != wanted:
            fixed = recount(res, wanted)
            if fixed is None:
                problems.append(f"output lengths {min(lens)}..{max(lens)}, asked {wanted} (ignore_eos not honoured?)")
            else:
                run["client_metrics"] = {k: run["metrics"].get(k) for k in fixed}
                run["metrics"].update(fixed)
                run["recounted"] = (
                    f"the client counted {min(lens)}..{max(lens)} output tokens (it ignores usage sent "
                    f"with a choice and re-tokenizes the text); every stream had >= {wanted} chunks, "
                    f"so tok/s and TPOT use {wanted} tokens per request (client_metrics: its numbers)"
                )
    if problems:
        run["problems"] = problems
    return run


def _agents_run(run: dict, res: dict) -> dict:
    run["metrics"] = dict(res.get("summary") or {})
    run["per_turn"] = res["per_turn"]
    if res.get("failed"):
        run["problems"] = [f"{res['failed']} of {res['agents'] * res['turns']} turns failed: {res.get('first_error')}"]
    return run


def agents_markdown(runs: list[dict]) -> list[str]:
    """Per turn and system: TTFT p50 and the share of the prompt the server reported as cached."""
    rows = [r for r in runs if r.get("per_turn")]
    if not rows:
        return []
    turns = max(len(r["per_turn"]) for r in rows)
    head = ["system"] + [cell for t in range(turns) for cell in (f"turn {t + 1}: TTFT p50 ms", "cached")]
    lines = ["", "Agents, turn by turn (each turn resends the history; cached: the share of its prompt "
             "the server reported as cached, - where it reports none):", "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [r.get("label") or r["system"]]
        for t in r["per_turn"]:
            share = "-" if t.get("cached_share") is None else f"{100 * t['cached_share']:.0f}%"
            cells += [fmt(1000 * t["ttft_p50_s"], 0), share]
        cells += [""] * (len(head) - len(cells))
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def fmt(value, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def ratio(a, b) -> float | None:
    if a is None or b is None or b == 0:
        return None
    return a / b


def table_head(first: str, workloads: list[str], columns: tuple[str, str, str]) -> list[str]:
    """A markdown table's header and rule: `first`, then the three columns per workload."""
    head = [first]
    for w in workloads:
        head += [f"{WORKLOAD_TITLES.get(w, w)}: {columns[0]}", *columns[1:]]
    return ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]


def markdown(runs: list[dict], baseline: str) -> str:
    systems: list[str] = []
    workloads: list[str] = []
    labels: dict[str, str] = {}
    cell: dict[tuple[str, str], dict] = {}
    for run in runs:
        if run["system"] not in systems:
            systems.append(run["system"])
        if run["workload"] not in workloads:
            workloads.append(run["workload"])
        labels[run["system"]] = run.get("label") or run["system"]
        cell[(run["system"], run["workload"])] = run

    def metric(system: str, workload: str, key: str):
        run = cell.get((system, workload))
        if not run or run["status"] != "ok" or run.get("problems"):
            return None
        return (run.get("metrics") or {}).get(key)

    lines = []
    lines += table_head("system", workloads, ("out tok/s", "TTFT med ms", "TPOT med ms"))
    notes = []
    recounted: list[str] = []
    noisy: list[str] = []
    for s in systems:
        row = [labels[s]]
        for w in workloads:
            run = cell.get((s, w))
            m = (run or {}).get("metrics") or {}
            mark = ""
            if run is None:
                row += ["", "", ""]
                continue
            if run["status"] != "ok" or run.get("problems"):
                mark = " (!)"
                why = run.get("problems") or [run.get("error") or run["status"]]
                notes.append(f"- {labels[s]} / {w}: {run['status']}; " + "; ".join(why))
            acct = run.get("cpu_accounting") or {}
            steal_s, wall_s = acct.get("steal_s", 0), acct.get("wall_s", 0)
            if acct.get("other_cpu_frac", 0) > NOISY_FRACTION or steal_s > NOISY_FRACTION * wall_s:
                noisy.append(
                    f"- {labels[s]} / {w}: other processes used {acct['other_cpu_s']:.0f} CPU-s "
                    f"({100 * acct['other_cpu_frac']:.0f}% of the machine) during the run"
                    + (f", steal {acct['steal_s']:.0f} s" if acct.get("steal_s") else "")
                )
                mark = mark or " (~)"
            if run.get("recounted") and not mark:
                mark = " (r)"
                recounted.append(f"{labels[s]} / {w}")
            row += [
                fmt(m.get("output_throughput")) + mark,
                fmt(m.get("median_ttft_ms"), 0),
                fmt(m.get("median_tpot_ms")),
            ]
        lines.append("| " + " | ".join(row) + " |")
    if recounted:
        lines.append("")
        lines.append(
            "(r) output tokens recounted: the server sends its usage with the last choice, which vLLM's "
            "client ignores (it re-tokenizes the text, which undercounts); the streams show every request "
            "produced all its tokens, so tok/s and TPOT use the asked length: " + ", ".join(recounted)
        )
    if noisy:
        lines.append("")
        lines.append("(~) the machine was not quiet (other processes competed for the 2 cores); these numbers are off:")
        lines += noisy
    if notes:
        lines.append("")
        lines.append("(!) not a clean run, left out of the ratios:")
        lines += notes

    peers = [s for s in systems if s != baseline]
    if baseline in systems and peers:
        lines.append("")
        lines.append(
            f"Ratios of {labels[baseline]} to each peer: output tok/s (>1: radixserve faster), "
            "median TTFT and median TPOT (<1: radixserve faster)."
        )
        lines.append("")
        lines += table_head("peer", workloads, ("tok/s x", "TTFT x", "TPOT x"))
        for p in peers:
            row = [labels[p]]
            for w in workloads:
                row += [
                    fmt(ratio(metric(baseline, w, "output_throughput"), metric(p, w, "output_throughput")), 2),
                    fmt(ratio(metric(baseline, w, "median_ttft_ms"), metric(p, w, "median_ttft_ms")), 2),
                    fmt(ratio(metric(baseline, w, "median_tpot_ms"), metric(p, w, "median_tpot_ms")), 2),
                ]
            lines.append("| " + " | ".join(row) + " |")
    lines += agents_markdown(runs)
    return "\n".join(lines)


def ratios_json(runs: list[dict], baseline: str) -> dict:
    by = {(r["system"], r["workload"]): r for r in runs}
    out: dict = {}
    for (system, workload), run in by.items():
        base = by.get((baseline, workload))
        if system == baseline or base is None:
            continue
        if any(r["status"] != "ok" or r.get("problems") for r in (run, base)):
            continue
        bm, pm = base.get("metrics") or {}, run.get("metrics") or {}
        out.setdefault(system, {})[workload] = {
            "output_throughput": ratio(bm.get("output_throughput"), pm.get("output_throughput")),
            "median_ttft": ratio(bm.get("median_ttft_ms"), pm.get("median_ttft_ms")),
            "p99_ttft": ratio(bm.get("p99_ttft_ms"), pm.get("p99_ttft_ms")),
            "median_tpot": ratio(bm.get("median_tpot_ms"), pm.get("median_tpot_ms")),
        }
    return out


def cmd_report(args: argparse.Namespace) -> None:
    with open(args.manifest) as f:
        runs = [load_run(json.loads(line)) for line in f if line.strip()]
    meta: dict = {}
    versions: dict = {}
    for item in args.meta or []:
        key, _, value = item.partition("=")
        if key.startswith("version."):
            versions[key[len("version."):]] = value
        else:
            meta[key] = value
    table = markdown(runs, args.baseline)
    cpu = cpu_info()
    report = {
        "date": dt.datetime.now().astimezone().isoformat(timespec="seconds"),
        "cpu": cpu,
        "versions": versions,
        **meta,
        "baseline": args.baseline,
        "runs": runs,
        "ratios_to_baseline": ratios_json(runs, args.baseline),
        "table_markdown": table,
    }
    with open(args.out, "w") as f:
        json.dump(report, f, indent=2)
        f.write("\n")
    flags = " ".join(k for k, v in cpu["flags"].items() if v) or "none of interest"
    family = f" (family {cpu['CPU family']} model {cpu.get('Model', '?')})" if "CPU family" in cpu else ""
    print(f"\nCPU: {cpu.get('Model name', 'unknown')}{family}, {cpu['nproc']} cores, flags: {flags}")
    print("Versions: " + "; ".join(f"{k} {v}" for k, v in versions.items()))
    print()
    print(table)
    print(f"\nAll numbers, commands and versions: {args.out}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="cmd", required=True)
    add = sub.add_parser("add")
    add.add_argument("--manifest", required=True)
    add.add_argument("--system", required=True)
    add.add_argument("--label")
    add.add_argument("--workload", required=True)
    add.add_argument("--status", required=True)
    add.add_argument("--result")
    add.add_argument("--server-cmd")
    add.add_argument("--bench-cmd")
    add.add_argument("--server-log")
    add.add_argument("--bench-log")
    add.add_argument("--error")
    add.add_argument("--loadavg-before", help="/proc/loadavg (1, 5, 15 min) just before the run")
    mea = sub.add_parser("measure", help="run a command, write the CPU accounting of the machine meanwhile")
    mea.add_argument("--server-pgid", type=int, required=True)
    mea.add_argument("--out", required=True)
    mea.add_argument("command", nargs=argparse.REMAINDER)
    rep = sub.add_parser("report")
    rep.add_argument("--manifest", required=True)
    rep.add_argument("--out", required=True)
    rep.add_argument("--baseline", default="radixserve")
    rep.add_argument("--meta", action="append")
    args = parser.parse_args()
    return {"add": cmd_add, "report": cmd_report, "measure": cmd_measure}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
