#!/usr/bin/env bash
# Usage: scripts/bench_router.sh [--quick] [--policy POLICY] [--port PORT]
#            [--replica-args "FLAGS"] [-- BENCH_SERVING_FLAGS...]
#
# scripts/bench_serving.py through sglang-router (scripts/serve_replicas.sh) in front of one
# radixserve replica, then against that replica directly (the router's overhead), then through
# the router in front of two, on the same shared-prefix workload; prints each run and the
# ratios (two replicas / one, router / direct), and writes results/bench_router-<date>[-quick].json with
# both reports, the commands and the versions.
#
#   --quick           smoke test: 4 requests (2 groups of 2, 64-token system prompts, 4 tokens out)
#   --policy POLICY   the router's policy (default cache_aware)
#   --port PORT       the router's port (default 30100; the replicas take the next ones)
#   --replica-args S  more `radixserve serve` flags for every replica, split on whitespace
#   -- FLAGS...       more bench_serving.py flags, after the workload's (so they override it)
#
# The workload (bench_serving's generated-shared-prefix, openai backend, so the router routes on
# the prompt text): 8 groups x 8 prompts, 1024-token system prompts, 128-token questions, 32
# tokens out, at most 16 in flight. The machine's cores are split between the replicas
# (--num-threads: all of them for one replica, half each for two), so on a small CPU this
# measures the router's overhead and cache locality, not scaling.
#
# Not part of `make test`: run it on a quiet machine.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VPY="$ROOT/.venv/bin/python"
say() { echo "bench_router: $*" >&2; }
die() { say "error: $*"; exit 1; }
usage() { sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d' | sed 's/^# \{0,1\}//'; }

QUICK=0
POLICY=cache_aware
PORT=30100
REPLICA_ARGS=""
BENCH_EXTRA=()
while [[ $# -gt 0 ]]; do
    case "$1" in
        --quick) QUICK=1; shift ;;
        --policy) POLICY="$2"; shift 2 ;;
        --port) PORT="$2"; shift 2 ;;
        --replica-args) REPLICA_ARGS="$2"; shift 2 ;;
        --) shift; BENCH_EXTRA=("$@"); break ;;
        -h|--help) usage; exit 0 ;;
        *) usage >&2; die "unknown argument: $1" ;;
    esac
done
read -r -a REPLICA_EXTRA <<<"$REPLICA_ARGS"
[[ -x "$VPY" ]] || die "$VPY is missing: run 'make setup' (scripts/setup.sh) first"

if [[ "$QUICK" == 1 ]]; then
    WORKLOAD=(--gsp-num-groups 2 --gsp-prompts-per-group 2 --gsp-system-prompt-len 64
              --gsp-question-len 8 --gsp-output-len 4 --max-concurrency 4 --warmup-requests 0)
else
    WORKLOAD=(--gsp-num-groups 8 --gsp-prompts-per-group 8 --gsp-system-prompt-len 1024
              --gsp-question-len 128 --gsp-output-len 32 --max-concurrency 16)
fi
WORKLOAD=(--backend openai --dataset generated-shared-prefix "${WORKLOAD[@]}" "${BENCH_EXTRA[@]}")

STAMP="$(date +%Y%m%d-%H%M%S)$([[ "$QUICK" == 1 ]] && echo -quick || true)"
OUT="$ROOT/results/bench_router-$STAMP"
mkdir -p "$OUT"
NCPU="$(nproc)"

SERVE_PID=""
stop_serving() {
    [[ -n "$SERVE_PID" ]] || return 0
    kill -TERM "$SERVE_PID" 2>/dev/null || true
    wait "$SERVE_PID" 2>/dev/null || true
    SERVE_PID=""
}
trap 'stop_serving' EXIT
trap 'stop_serving; exit 130' INT TERM

bench_with() {  # bench_with N: serve N replicas behind the router, run the workload, stop
    local n="$1" threads log
    threads=$((NCPU / n > 0 ? NCPU / n : 1))
    log="$OUT/serve_replicas-$n.log"
    echo "--num-threads $threads ${REPLICA_EXTRA[*]}" >"$OUT/replica_args-$n.txt"
    say "starting $n replica(s) with --num-threads $threads ${REPLICA_EXTRA[*]} (log: $log)"
    bash "$ROOT/scripts/serve_replicas.sh" -n "$n" --port "$PORT" --policy "$POLICY" \
        --log-dir "$OUT/logs-$n" -- --num-threads "$threads" "${REPLICA_EXTRA[@]}" \
        >"$log" 2>&1 </dev/null &
    SERVE_PID=$!
    until grep -q '^ready:' "$log"; do
        if ! kill -0 "$SERVE_PID" 2>/dev/null; then
            cat "$log" >&2
            die "serve_replicas.sh -n $n failed"
        fi
        sleep 1
    done
    say "running bench_serving.py through the router: ${WORKLOAD[*]}"
    "$VPY" "$ROOT/scripts/bench_serving.py" --base-url "http://127.0.0.1:$PORT" \
        --output-file "$OUT/bench-$n.jsonl" --disable-tqdm "${WORKLOAD[@]}"
    if [[ "$n" == 1 ]]; then  # the same replica without the router: the router's overhead
        curl -sf -X POST "http://127.0.0.1:$((PORT + 1))/flush_cache" >/dev/null
        say "running bench_serving.py against the replica directly"
        "$VPY" "$ROOT/scripts/bench_serving.py" --base-url "http://127.0.0.1:$((PORT + 1))" \
            --output-file "$OUT/bench-direct.jsonl" --disable-tqdm "${WORKLOAD[@]}"
    fi
    stop_serving
}

bench_with 1
bench_with 2

"$VPY" - "$OUT" "$ROOT/results/bench_router-$STAMP.json" "$POLICY" "$NCPU" "${WORKLOAD[@]}" <<'EOF'
import json, subprocess, sys, time
from importlib.metadata import version
out, dest, policy, ncpu, workload = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5:]
runs = {}
for n in ("direct", "1", "2"):
    with open(f"{out}/bench-{n}.jsonl") as fh:
        runs[n] = json.loads(fh.readlines()[-1])
    with open(f"{out}/replica_args-{'1' if n == 'direct' else n}.txt") as fh:
        runs[n]["replica_args"] = fh.read().split()
keys = ("output_throughput", "request_throughput", "mean_ttft_ms", "median_ttft_ms",
        "mean_tpot_ms", "mean_e2e_latency_ms", "cache_hit_rate")
ratio = {k: runs["2"][k] / runs["1"][k] if runs["1"][k] else None for k in keys}
overhead = {k: runs["1"][k] / runs["direct"][k] if runs["direct"][k] else None for k in keys}
commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
report = {"date": time.strftime("%Y-%m-%d %H:%M:%S"), "git_commit": commit, "cpus": int(ncpu),
          "policy": policy, "workload": workload,
          "versions": {name: version(name) for name in ("sglang-router", "radixserve")},
          "runs": runs, "ratio_two_over_one": ratio, "ratio_router_over_direct": overhead}
with open(dest, "w") as fh:
    json.dump(report, fh, indent=2)
fmt = lambda r: "-" if r is None else f"{r:.2f}"
print(f"\n{'':24}{'direct':>10}{'router+1':>10}{'router+2':>10}{'2 / 1':>8}{'1 / direct':>12}")
for k in keys:
    print(f"{k:24}{runs['direct'][k]:10.2f}{runs['1'][k]:10.2f}{runs['2'][k]:10.2f}"
          f"{fmt(ratio[k]):>8}{fmt(overhead[k]):>12}")
print("completed/failed: " + ", ".join(f"{n} {runs[n]['completed']}/{runs[n]['failed']}" for n in runs)
      + f"\nresults: {dest}")
EOF
