#!/usr/bin/env bash
# Usage: scripts/bench_tp.sh [--quick] [--port PORT] [--sizes "1 2"] [--server-args "FLAGS"]
#
# scripts/bench_serving.py against `radixserve serve --tp-size N` for each N of --sizes, one
# server at a time, on the same two workloads: single-stream (c1: 8 prompts, 128 tokens in, 64
# out) and concurrency 16 (c16: 64 prompts, 256 in, 128 out). Prints each run and the ratios
# against the first size, and writes results/bench_tp-<date>[-quick].json.
#
#   --quick          smoke test: 4 requests per workload, 8 tokens out
#   --port PORT      the server's port (default 30200)
#   --sizes "1 2"    the tp sizes, the first is the baseline
#   --server-args S  more `radixserve serve` flags, split on whitespace
#
# On a CPU the ranks share its cores (--num-threads defaults to cores / tp_size per rank), so
# this measures what tensor parallelism costs there (collectives over gloo), not what it gains
# on GPUs with NVLink. Not part of `make test`: run it on a quiet machine.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VPY="$ROOT/.venv/bin/python"
say() { echo "bench_tp: $*" >&2; }
die() { say "error: $*"; exit 1; }

QUICK=0
PORT=30200
SIZES="1 2"
SERVER_ARGS=""
while [[ $# -gt 0 ]]; do
    case "$1" in
        --quick) QUICK=1; shift ;;
        --port) PORT="$2"; shift 2 ;;
        --sizes) SIZES="$2"; shift 2 ;;
        --server-args) SERVER_ARGS="$2"; shift 2 ;;
        -h|--help) sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d' | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) die "unknown argument: $1" ;;
    esac
done
read -r -a SERVER_EXTRA <<<"$SERVER_ARGS"
read -r -a TP_SIZES <<<"$SIZES"
[[ -x "$VPY" ]] || die "$VPY is missing: run 'make setup' (scripts/setup.sh) first"

if [[ "$QUICK" == 1 ]]; then
    C1=(--num-prompts 4 --random-input-len 32 --random-output-len 8 --max-concurrency 1 --warmup-requests 0)
    C16=(--num-prompts 4 --random-input-len 32 --random-output-len 8 --max-concurrency 4 --warmup-requests 0)
else
    C1=(--num-prompts 8 --random-input-len 128 --random-output-len 64 --max-concurrency 1)
    C16=(--num-prompts 64 --random-input-len 256 --random-output-len 128 --max-concurrency 16)
fi

STAMP="$(date +%Y%m%d-%H%M%S)$([[ "$QUICK" == 1 ]] && echo -quick || true)"
OUT="$ROOT/results/bench_tp-$STAMP"
mkdir -p "$OUT"

SERVER_PID=""
stop_server() {
    [[ -n "$SERVER_PID" ]] || return 0
    kill -TERM "$SERVER_PID" 2>/dev/null || true
    wait "$SERVER_PID" 2>/dev/null || true
    SERVER_PID=""
}
trap 'stop_server' EXIT
trap 'stop_server; exit 130' INT TERM

for tp in "${TP_SIZES[@]}"; do
    log="$OUT/server-tp$tp.log"
    say "starting radixserve --tp-size $tp ${SERVER_EXTRA[*]} (log: $log)"
    "$ROOT/.venv/bin/radixserve" serve --port "$PORT" --tp-size "$tp" "${SERVER_EXTRA[@]}" >"$log" 2>&1 &
    SERVER_PID=$!
    until curl -sf "http://127.0.0.1:$PORT/health" >/dev/null 2>&1; do
        kill -0 "$SERVER_PID" 2>/dev/null || { tail -20 "$log" >&2; die "the tp $tp server died"; }
        sleep 1
    done
    for name in c1 c16; do
        declare -n flags="${name^^}"
        say "tp $tp, $name: ${flags[*]}"
        "$VPY" "$ROOT/scripts/bench_serving.py" --base-url "http://127.0.0.1:$PORT" --backend openai \
            --output-file "$OUT/bench-tp$tp-$name.jsonl" --disable-tqdm "${flags[@]}" >"$OUT/bench-tp$tp-$name.txt"
        unset -n flags
    done
    stop_server
done

"$VPY" - "$OUT" "$ROOT/results/bench_tp-$STAMP.json" "${TP_SIZES[@]}" <<'EOF'
import json, os, subprocess, sys, time
out, dest, sizes = sys.argv[1], sys.argv[2], sys.argv[3:]
keys = ("output_throughput", "median_ttft_ms", "median_tpot_ms", "mean_e2e_latency_ms")
runs = {f"tp{tp}-{w}": json.loads(open(f"{out}/bench-tp{tp}-{w}.jsonl").readlines()[-1])
        for tp in sizes for w in ("c1", "c16")}
commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
json.dump({"date": time.strftime("%Y-%m-%d %H:%M:%S"), "git_commit": commit, "cpus": os.cpu_count(),
           "runs": runs}, open(dest, "w"), indent=2)
base = sizes[0]
print(f"\n{'run':12}" + "".join(f"{k:>22}" for k in keys) + f"{'tok/s vs tp' + base:>16}")
for tp in sizes:
    for w in ("c1", "c16"):
        r, b = runs[f"tp{tp}-{w}"], runs[f"tp{base}-{w}"]
        print(f"{'tp' + tp + ' ' + w:12}" + "".join(f"{r[k]:22.2f}" for k in keys)
              + f"{r['output_throughput'] / b['output_throughput']:16.2f}")
print(f"results: {dest}")
EOF
