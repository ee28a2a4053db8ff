#!/usr/bin/env bash
# Usage: scripts/serve_replicas.sh [-n N] [--port PORT] [--policy POLICY] [--host HOST]
#            [--log-dir DIR] [--router-args "FLAGS"] [--ready-timeout S] [-- REPLICA_FLAGS...]
#
# Data-parallel serving on one machine: N radixserve replicas behind SGLang's router
# (sglang-router, the `router` extra), started and stopped with one command.
#
#   scripts/serve_replicas.sh -n 2 --port 30000 -- --num-threads 1
#
#   -n N              replicas (default 2), on ports PORT+1 .. PORT+N
#   --port PORT       the router's port (default 30000); its Prometheus exporter gets PORT+N+1
#   --policy POLICY   the router's policy: cache_aware (default), round_robin, random,
#                     power_of_two (reads each replica's GET /get_load)
#   --host HOST       where the replicas and the router listen (default 127.0.0.1)
#   --log-dir DIR     one log per replica and one for the router (default: a new temporary folder)
#   --router-args S   more launch_router flags, split on whitespace
#                     (e.g. "--health-check-interval-secs 5"; see launch_router --help)
#   --ready-timeout S seconds a replica may take to answer /health 200 (default 600)
#   -- FLAGS...       passed to every `radixserve serve` (e.g. --num-threads 1 --model-path DIR)
#
# Installs the router extra into .venv when `import sglang_router` fails. Waits for each replica's
# /health, then for the router to count all N replicas healthy (its own /health answers before it
# has registered any), then prints the URLs and the pids. Ctrl-C or SIGTERM stops everything: the
# router and the replicas drain (up to 30 s), then whatever is left of their process groups is
# killed (a background job of a non-interactive shell ignores SIGINT: send it SIGTERM). A replica
# that dies is reported and the router keeps serving from the others; if the router dies,
# everything stops and the script exits 1.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VPY="$ROOT/.venv/bin/python"
RADIXSERVE="$ROOT/.venv/bin/radixserve"

say() { echo "serve_replicas: $*" >&2; }
die() { say "error: $*"; exit 1; }
usage() { sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d' | sed 's/^# \{0,1\}//'; }

N=2
PORT=30000
POLICY=cache_aware
HOST=127.0.0.1
LOG_DIR=""
ROUTER_ARGS=""
READY_TIMEOUT=600
REPLICA_ARGS=()
while [[ $# -gt 0 ]]; do
    case "$1" in
        -n|--replicas) N="$2"; shift 2 ;;
        --port) PORT="$2"; shift 2 ;;
        --policy) POLICY="$2"; shift 2 ;;
        --host) HOST="$2"; shift 2 ;;
        --log-dir) LOG_DIR="$2"; shift 2 ;;
        --router-args) ROUTER_ARGS="$2"; shift 2 ;;
        --ready-timeout) READY_TIMEOUT="$2"; shift 2 ;;
        --) shift; REPLICA_ARGS=("$@"); break ;;
        -h|--help) usage; exit 0 ;;
        *) usage >&2; die "unknown argument: $1" ;;
    esac
done
[[ "$N" =~ ^[1-9][0-9]*$ ]] || die "-n must be a positive integer, not '$N'"
[[ "$PORT" =~ ^[0-9]+$ ]] && ((PORT + N + 1 <= 65535)) ||
    die "--port $PORT leaves no room for $N replicas"
[[ -x "$RADIXSERVE" ]] || die "$RADIXSERVE is missing: run 'make setup' (scripts/setup.sh) first"
read -r -a ROUTER_EXTRA <<<"$ROUTER_ARGS"

# The router extra, pinned in pyproject.toml (one place for its version).
router_requirements() {
    "$VPY" - "$ROOT/pyproject.toml" <<'EOF'
import sys, tomllib
extras = tomllib.load(open(sys.argv[1], "rb"))["project"]["optional-dependencies"]
print("\n".join(extras["router"]))
EOF
}
if ! "$VPY" -c "import sglang_router" >/dev/null 2>&1; then
    mapfile -t router_reqs < <(router_requirements)
    say "installing the router extra into .venv: ${router_reqs[*]}"
    "$VPY" -m pip install -q --disable-pip-version-check "${router_reqs[@]}" \
        2> >(grep -v --line-buffered "is ignored: it is neither a file nor a directory" >&2)
fi

if [[ -z "$LOG_DIR" ]]; then LOG_DIR="$(mktemp -d "${TMPDIR:-/tmp}/radixserve-replicas-XXXXXX")"; fi
mkdir -p "$LOG_DIR"

# Each child runs in its own session and process group (setsid; in a non-interactive shell it does
# not fork, so $! is the child's pid and its group id). A Ctrl-C at the terminal reaches only this
# script, which then stops the children in order.
PIDS=()
ROUTER_PID=""
STOPPING=0
stop_all() {
    [[ "$STOPPING" == 0 ]] || return 0
    STOPPING=1
    local pid i alive
    for pid in "$ROUTER_PID" "${PIDS[@]}"; do
        [[ -n "$pid" ]] && kill -TERM "$pid" 2>/dev/null || true
    done
    for ((i = 0; i < 40; i++)); do
        alive=0
        for pid in "$ROUTER_PID" "${PIDS[@]}"; do
            [[ -n "$pid" ]] && kill -0 "$pid" 2>/dev/null && alive=1
        done
        ((alive)) || break
        sleep 1
    done
    # Whatever is left of each process group (a replica that did not drain in time, or children
    # of one that was killed) goes too.
    for pid in "$ROUTER_PID" "${PIDS[@]}"; do
        [[ -n "$pid" ]] || continue
        if kill -0 -- "-$pid" 2>/dev/null; then
            kill -TERM -- "-$pid" 2>/dev/null || true
            sleep 1
            kill -KILL -- "-$pid" 2>/dev/null || true
        fi
        wait "$pid" 2>/dev/null || true
    done
}
trap 'stop_all' EXIT
trap 'say "stopping"; stop_all; exit 0' INT TERM

replica_url() { echo "http://$HOST:$((PORT + $1))"; }

for ((i = 1; i <= N; i++)); do
    setsid "$RADIXSERVE" serve --host "$HOST" --port "$((PORT + i))" "${REPLICA_ARGS[@]}" \
        >"$LOG_DIR/replica-$i.log" 2>&1 </dev/null &
    PIDS+=("$!")
done

http_code() { curl -s -m 5 -o /dev/null -w '%{http_code}' "$1" 2>/dev/null || true; }

t0=$(date +%s)
for ((i = 1; i <= N; i++)); do
    until [[ "$(http_code "$(replica_url "$i")/health")" == 200 ]]; do
        if ! kill -0 "${PIDS[i - 1]}" 2>/dev/null; then
            tail -n 30 "$LOG_DIR/replica-$i.log" >&2
            die "replica $i exited while starting (log: $LOG_DIR/replica-$i.log)"
        fi
        (($(date +%s) - t0 < READY_TIMEOUT)) || die "replica $i not healthy after $READY_TIMEOUT s"
        sleep 0.5
    done
done
say "$N replica(s) healthy after $(($(date +%s) - t0)) s"

workers=()
for ((i = 1; i <= N; i++)); do workers+=("$(replica_url "$i")"); done
setsid "$VPY" -m sglang_router.launch_router --host "$HOST" --port "$PORT" \
    --worker-urls "${workers[@]}" --policy "$POLICY" \
    --prometheus-host "$HOST" --prometheus-port "$((PORT + N + 1))" \
    --shutdown-grace-period-secs 30 "${ROUTER_EXTRA[@]}" \
    >"$LOG_DIR/router.log" 2>&1 </dev/null &
ROUTER_PID=$!

# The router's /readiness counts its healthy workers once it has registered them.
router_healthy() {
    curl -s -m 5 "http://$HOST:$PORT/readiness" 2>/dev/null |
        "$VPY" -c 'import json, sys
try:
    print(json.load(sys.stdin).get("healthy_workers", 0))
except ValueError:
    print(0)'
}
t0=$(date +%s)
until [[ "$(http_code "http://$HOST:$PORT/health")" == 200 && "$(router_healthy)" == "$N" ]]; do
    if ! kill -0 "$ROUTER_PID" 2>/dev/null; then
        tail -n 30 "$LOG_DIR/router.log" >&2
        die "the router exited while starting (log: $LOG_DIR/router.log)"
    fi
    (($(date +%s) - t0 < 120)) || die "the router did not count $N healthy replicas in 120 s"
    sleep 0.25
done

echo "router:    http://$HOST:$PORT (policy $POLICY, pid $ROUTER_PID)"
for ((i = 1; i <= N; i++)); do echo "replica $i: $(replica_url "$i") (pid ${PIDS[i - 1]})"; done
echo "logs:      $LOG_DIR"
echo "ready: Ctrl-C stops everything"

# Supervise: `sleep & wait` keeps the traps prompt.
declare -A REPORTED=()
while true; do
    kill -0 "$ROUTER_PID" 2>/dev/null || die "the router exited (log: $LOG_DIR/router.log)"
    for ((i = 1; i <= N; i++)); do
        if [[ -z "${REPORTED[$i]:-}" ]] && ! kill -0 "${PIDS[i - 1]}" 2>/dev/null; then
            say "replica $i (pid ${PIDS[i - 1]}) exited; the router serves from the others"
            REPORTED[$i]=1
        fi
    done
    sleep 1 &
    wait $! || true
done
