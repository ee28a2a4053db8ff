#!/usr/bin/env bash
# The agents benchmark where the KV pool is too small (issue 38): radixserve with and without its
# KV tier, its persistent store across a restart, vLLM-CPU and llama.cpp, one at a time, side by side.
#
#   scripts/bench_tier.sh                  # every system, 24 sessions (about 20 minutes on 2 cores)
#   scripts/bench_tier.sh --sessions 64    # 64 sessions against a 64k pool, radixserve's default (~50 min)
#   scripts/bench_tier.sh --quick          # smoke test (about 3 minutes, 1.5 of them vLLM's start)
#   scripts/bench_tier.sh --systems radixserve,radixserve-tier --sessions 8
#
# The workload (scripts/bench_agents.py --sessions, the same seed and text for every system): S
# sessions of T turns, each turn streaming --max-tokens tokens (greedy, ignore_eos) through
# /v1/chat/completions; a ~800-token system prompt shared by all, a long task of each session's own
# and a ~250-token tool result per turn, so that a session's last prompt is about --history-tokens.
# Every round each session takes one turn, the sessions in a shuffled order, --concurrency turns in
# flight. The KV pool holds --pool-tokens (default S x 1024: S sessions of ~3k tokens are 3x the
# pool, as 64 sessions x 3k against radixserve's 64k default), so a session that comes back has
# mostly lost its history from the pool. The default is 24 sessions, not 64, to fit all five
# systems in ~20 minutes: per session (4 turns of ~3k tokens) radixserve takes ~10 s without the
# tier and ~5.5 s with it, llama.cpp ~9.5 s, vLLM ~13 s, plus ~2.5 minutes of server starts.
# At 24 sessions the 4 turns in flight (~12k tokens) leave the pool room for 17% of the
# sessions' histories, 28% at 64, so the systems without a tier get slightly fewer lucky hits.
# Every server start (the restart too) is followed by one unrelated prompt as long as a session's,
# so that a first long prefill's set-up cost lands in no measured turn. Turn 1 of every session is
# cold; the returning turns (2..T) are what the table compares: TTFT p50/p99, the p99's ratio to
# radixserve without the tier, output tok/s over their span, and the share of their prompts the
# server reports cached (vLLM reports none).
#
# Systems (--systems, comma-separated; the order is kept). All serve the default model's HF folder
# in the dtype radixserve's --dtype auto picks on this CPU, as bench_peers.sh's radixserve-full,
# vllm and llamacpp rows:
#   radixserve        radixserve serve --model-path HF --max-total-tokens POOL: no tier (the baseline)
#   radixserve-tier   the same + --kv-tier-gb 4: evicted KV kept in host memory, loaded back by cost
#   radixserve-store  the same + --kv-store DIR (a 4 GB memory-mapped file): turns 1..K
#                     (--split-turn K, default 2), then SIGTERM, a new server on the same DIR, and
#                     turns K+1..T; turn K+1's row shows where the first turn after the restart came
#                     from (the store's restored blocks, tier loads, cached tokens). The file is in
#                     the page cache after phase one: this measures a restart, not a cold disk.
#   vllm              vLLM-CPU 0.32.0, prefix caching on, a KV cache of POOL tokens: its bytes are
#                     POOL x 2 (K and V) x layers x kv_heads x head_dim x dtype bytes, from the model's
#                     config.json (SmolLM2-135M: 2 x 30 x 3 x 64 = 11520 elements a token, 23040 bytes
#                     in bf16: 64k tokens are 1.41 GiB, 24k tokens 0.53 GiB), passed as
#                     --kv-cache-memory-bytes because VLLM_CPU_KVCACHE_SPACE only takes whole GiB (it
#                     is unset here: it would override the bytes); --max-model-len the slot size
#                     below. vLLM-CPU has no host tier to enable: evicted prefixes are recomputed.
#   llamacpp          llama-server on the GGUF of the HF folder (same dtype; its KV is f16, as many
#                     bytes a token as bf16): POOL tokens of context in slots of the largest prompt
#                     plus its answer and some room (4096 at 3k tokens), at least --concurrency
#                     slots, continuous batching, every core; its host prompt cache on at its default
#                     size, --cache-ram 8192 MiB: a slot handed to another session saves its prompt's
#                     KV there and a returning session's is loaded back by longest common prefix (its
#                     counterpart of the tier; it keeps whole prompts, the shared system prompt in
#                     each, so it needs more room than radixserve's deduplicated blocks). Slot choice
#                     by prompt similarity stays at its default (0.10); --cache-reuse stays off: it
#                     shifts KV chunks found past a mismatch, and these prompts only grow at the end.
#
# Reuses from scripts/bench_peers.sh (by name, below): the dtype choice, how servers are started in
# their own process group, waited for (a one-token completion) and stopped (SIGTERM, then the
# group), the vLLM environment (cores, TCMalloc, offline), and peers_table.py's CPU accounting of
# each run. It installs nothing: `scripts/bench_peers.sh --install-only --systems vllm,llamacpp`
# first where vLLM or the GGUF is missing.
# Results: results/bench_tier-<date>[-quick].jsonl (one bench_agents.py record per run, then one
# line of settings and commands), the CPU accounting beside it, logs in .peers/logs; the table at
# the end.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PEERS="$ROOT/.peers"
LOGS="$PEERS/logs"
RADIXSERVE="$ROOT/.venv/bin/radixserve"
RS_PY="$ROOT/.venv/bin/python"
VENV="$PEERS/vllm-venv"
VLLM="$VENV/bin/vllm"
LLAMA_SERVER="$PEERS/src/llama_cpp_python-0.3.36/vendor/llama.cpp/build/bin/llama-server"
TABLE="$ROOT/scripts/peers_table.py"
ALL_SYSTEMS="radixserve,radixserve-tier,radixserve-store,vllm,llamacpp"

say() { echo "bench_tier: $*" >&2; }
die() { say "error: $*"; exit 1; }
usage() { sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d' | sed 's/^# \{0,1\}//'; }

# bench_peers.sh is a script, not a library: take its helpers out of it by name (a one-line
# function, or from `name() {` to the `}` that closes it at column 0).
PEERS_HELPERS=(cpu_has auto_dtype norm_dtype vllm_dtype_name find_tcmalloc gguf_path free_port quote
    stop_server start_server wait_ready server_cmd)
# shellcheck disable=SC1090 # generated from bench_peers.sh
source <(awk -v want=" ${PEERS_HELPERS[*]} " '
    !body && /^[a-z_0-9]+\(\) \{/ {
        name = substr($0, 1, index($0, "(") - 1)
        if (index(want, " " name " ")) { print; body = ($0 !~ /\}$/) }
        next
    }
    body { print; if ($0 == "}") body = 0 }' "$ROOT/scripts/bench_peers.sh")
for f in "${PEERS_HELPERS[@]}"; do
    declare -F "$f" >/dev/null || die "scripts/bench_peers.sh has no function $f any more"
done

# ----------------------------------------------------------------------------- arguments
SYSTEMS="$ALL_SYSTEMS"
QUICK=0
SESSIONS="" POOL="" HISTORY="" SYSTEM_WORDS="" TURNS="" SPLIT="" CONCURRENCY=""
MAX_TOKENS=32
SEED=1
READY_TIMEOUT=900
while [[ $# -gt 0 ]]; do
    case "$1" in
        --systems) SYSTEMS="$2"; shift 2 ;;
        --quick) QUICK=1; shift ;;
        --sessions) SESSIONS="$2"; shift 2 ;;
        --pool-tokens) POOL="$2"; shift 2 ;;
        --history-tokens) HISTORY="$2"; shift 2 ;;
        --turns) TURNS="$2"; shift 2 ;;
        --split-turn) SPLIT="$2"; shift 2 ;;
        --concurrency) CONCURRENCY="$2"; shift 2 ;;
        --max-tokens) MAX_TOKENS="$2"; shift 2 ;;
        --seed) SEED="$2"; shift 2 ;;
        --ready-timeout) READY_TIMEOUT="$2"; shift 2 ;;
        -h|--help)
            usage
            echo "Options: --systems LIST, --quick, --sessions S (24), --pool-tokens P (S x 1024), --history-tokens H"
            echo "(3000), --turns T (4), --split-turn K (2), --concurrency C (4), --max-tokens N (32), --seed N (1),"
            echo "--ready-timeout S (900). --quick: 4 sessions of ~800 tokens (a 200-word system prompt), 3 turns,"
            echo "split after 2, 2 at once, a 2048-token pool."
            exit 0 ;;
        *) usage >&2; die "unknown argument: $1" ;;
    esac
done
# The defaults, or --quick's; an option given wins over both.
if [[ "$QUICK" == 1 ]]; then
    : "${SESSIONS:=4}" "${HISTORY:=800}" "${SYSTEM_WORDS:=200}" "${TURNS:=3}" "${CONCURRENCY:=2}" "${POOL:=2048}"
fi
: "${SESSIONS:=24}" "${HISTORY:=3000}" "${SYSTEM_WORDS:=800}" "${TURNS:=4}" "${SPLIT:=2}" "${CONCURRENCY:=4}"
: "${POOL:=$((SESSIONS * 1024))}"
IFS=',' read -r -a SYSTEM_LIST <<<"$SYSTEMS"
for s in "${SYSTEM_LIST[@]}"; do
    [[ ",$ALL_SYSTEMS," == *",$s,"* ]] || die "unknown system '$s' (known: $ALL_SYSTEMS)"
done
[[ -x "$RADIXSERVE" ]] || die "$RADIXSERVE is missing: run 'make setup' (scripts/setup.sh) first"
((SPLIT > 0 && SPLIT < TURNS)) || die "--split-turn must be between 1 and --turns - 1"

# ----------------------------------------------------------------------------- settings
CPU_FLAGS="$(grep -m1 '^flags' /proc/cpuinfo | cut -d: -f2 || true)"
NCPU="$(nproc)"
PEER_DTYPE="$(auto_dtype)"
VLLM_DTYPE="$PEER_DTYPE"
HF_DIR="$("$RADIXSERVE" model-path)"
[[ -f "$HF_DIR/config.json" ]] || die "radixserve model-path gave '$HF_DIR', which has no config.json"
TCMALLOC="$(find_tcmalloc)"
# KV bytes a token: K and V of every layer's KV heads, in the dtype both engines keep KV in here.
KV_TOKEN_BYTES="$(python3 -c 'import json, sys
c = json.load(open(sys.argv[1]))
head_dim = c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"]
print(2 * c["num_hidden_layers"] * c["num_key_value_heads"] * head_dim * (2 if sys.argv[2] == "bf16" else 4))' \
    "$HF_DIR/config.json" "$PEER_DTYPE")"
# A slot (llama.cpp) or a sequence (vLLM's --max-model-len) holds the longest prompt, its answer and
# room for the chat template's tokens, in 256-token steps.
SLOT_CTX=$(((HISTORY + MAX_TOKENS + 512 + 255) / 256 * 256))
SLOTS=$((POOL / SLOT_CTX > CONCURRENCY ? POOL / SLOT_CTX : CONCURRENCY))
LLAMA_CTX=$((SLOTS * SLOT_CTX > POOL ? SLOTS * SLOT_CTX : POOL))
LLAMA_CACHE_RAM_MIB=8192
unset VLLM_CPU_KVCACHE_SPACE  # in whole GiB, and it overrides --kv-cache-memory-bytes

STAMP="$(date +%Y%m%d-%H%M%S)"
STORE_DIR="$PEERS/kv-store-bench-tier-$STAMP"
NAME="bench_tier-$STAMP"
if [[ "$QUICK" == 1 ]]; then NAME="$NAME-quick"; fi
mkdir -p "$ROOT/results/$NAME" "$LOGS"
OUT="$ROOT/results/$NAME.jsonl"
RAW="$ROOT/results/$NAME"
: >"$OUT"
SERVER_PID=""
SERVER_LOG=""
trap 'stop_server; rm -rf "$STORE_DIR"' EXIT
trap 'exit 130' INT TERM

# The command line of each system (SRV_ENV, SRV_CMD) on PORT; STORE_DIR holds radixserve-store's file.
tier_server_cmd() {  # tier_server_cmd SYSTEM PORT
    local system="$1" port="$2" env_kept=() e
    SRV_ENV=()
    SRV_CMD=("$RADIXSERVE" serve --host 127.0.0.1 --port "$port" --model-path "$HF_DIR" --max-total-tokens "$POOL")
    case "$system" in
        radixserve-tier) SRV_CMD+=(--kv-tier-gb 4) ;;
        radixserve-store) SRV_CMD+=(--kv-store "$STORE_DIR") ;;
        vllm)
            server_cmd vllm "$port"  # bench_peers.sh's environment and flags for vLLM-CPU
            for e in "${SRV_ENV[@]}"; do [[ "$e" == VLLM_CPU_KVCACHE_SPACE=* ]] || env_kept+=("$e"); done
            SRV_ENV=("${env_kept[@]}")
            SRV_CMD+=(--kv-cache-memory-bytes "$((POOL * KV_TOKEN_BYTES))" --max-model-len "$SLOT_CTX")
            ;;
        llamacpp)
            SRV_CMD=("$LLAMA_SERVER" -m "$(gguf_path "$PEER_DTYPE")" --host 127.0.0.1 --port "$port"
                -np "$SLOTS" -c "$LLAMA_CTX" -cb -t "$NCPU" -tb "$NCPU" --cache-ram "$LLAMA_CACHE_RAM_MIB"
                --alias "$(basename "$HF_DIR")" --no-webui)
            ;;
    esac
}

bench_args() {  # bench_args PORT MODEL LABEL [PHASE ARGS...]: sets BENCH
    local port="$1" model="$2" label="$3"
    shift 3
    BENCH=("$RS_PY" "$ROOT/scripts/bench_agents.py" --base-url "http://127.0.0.1:$port" --model "$model"
        --mode chat --sessions "$SESSIONS" --concurrency "$CONCURRENCY" --turns "$TURNS" --seed "$SEED"
        --system-words "$SYSTEM_WORDS" --history-tokens "$HISTORY" --tool-result-words 250
        --max-tokens "$MAX_TOKENS" --label "$label" --output-file "$OUT" "$@")
}

# One completion of a prompt as long as a session's, sharing no prefix with any session's, one token
# out: a server's first long prefill is slow (allocations, kernel set-up), and every start, the
# restart included, should pay that here rather than in the turns measured.
warm_up() {  # warm_up PORT MODEL
    python3 - "$1" "$2" "$HISTORY" <<'PY'
import json, sys, urllib.request
port, model, words = sys.argv[1], sys.argv[2], int(sys.argv[3])
body = {"model": model, "prompt": "Warm-up: " + " ".join(["river stone"] * (words // 2)), "max_tokens": 1,
        "temperature": 0}
request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
urllib.request.urlopen(request, timeout=600).read()
PY
}

SERVER_LINES=()
start_ready() {  # start_ready SYSTEM LOGNAME: start it, wait, warm it up; sets PORT and MODEL
    PORT="$(free_port)"
    tier_server_cmd "$1" "$PORT"
    SERVER_LINES+=("$2: $(quote "${SRV_ENV[@]}" "${SRV_CMD[@]}")")
    start_server "$2" "${SRV_ENV[@]}" -- "${SRV_CMD[@]}"
    MODEL="$(wait_ready "$PORT" "$READY_TIMEOUT")" && warm_up "$PORT" "$MODEL"
}

run_bench() {  # run_bench NAME: run $BENCH, accounting the machine's CPU, log to .peers/logs
    local log="$LOGS/bench-tier-$1-$STAMP.log"
    say "$1: $(quote "${BENCH[@]}") (log: $log)"
    python3 "$TABLE" measure --server-pgid "$SERVER_PID" --out "$RAW/$1.cpu.json" -- "${BENCH[@]}" \
        > >(tee "$log") 2>&1 || say "$1: the client reported failed turns (see $log)"
}

run_system() {
    local system="$1" t0
    t0=$(date +%s)
    if [[ "$system" == radixserve-store ]]; then rm -rf "$STORE_DIR"; fi
    if ! start_ready "$system" "$system"; then
        stop_server
        say "$system: the server did not become ready; skipped"
        return 0
    fi
    if [[ "$system" != radixserve-store ]]; then
        bench_args "$PORT" "$MODEL" "$system"
        run_bench "$system"
    else
        bench_args "$PORT" "$MODEL" "$system" --phase first --split-turn "$SPLIT" --state-file "$RAW/state.json"
        run_bench "$system-first"
        say "$system: SIGTERM, then a new server on $STORE_DIR"
        stop_server
        if start_ready "$system" "$system-restart"; then
            bench_args "$PORT" "$MODEL" "$system" --phase rest --split-turn "$SPLIT" --state-file "$RAW/state.json"
            run_bench "$system-rest"
        fi
        rm -rf "$STORE_DIR"
    fi
    stop_server
    say "$system took $(($(date +%s) - t0)) s"
}

for system in "${SYSTEM_LIST[@]}"; do
    if [[ "$system" == vllm && ! -x "$VLLM" ]]; then die "$VLLM is missing: scripts/bench_peers.sh --install-only"; fi
    if [[ "$system" == llamacpp && ! -f "$(gguf_path "$PEER_DTYPE")" ]]; then
        die "$(gguf_path "$PEER_DTYPE") is missing: scripts/bench_peers.sh --install-only --systems llamacpp"
    fi
done
say "pool $POOL tokens ($((POOL * KV_TOKEN_BYTES)) bytes of $PEER_DTYPE KV), $SESSIONS sessions of ~$HISTORY tokens," \
    "$TURNS turns, $CONCURRENCY at once; llama.cpp $SLOTS slots x $((LLAMA_CTX / SLOTS)) tokens; load $(cut -d' ' -f1-3 /proc/loadavg)"
for system in "${SYSTEM_LIST[@]}"; do
    run_system "$system"
done

# ----------------------------------------------------------------------------- report
RS_COMMIT="$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)"
git -C "$ROOT" diff --quiet HEAD 2>/dev/null || RS_COMMIT="$RS_COMMIT (with uncommitted changes)"
python3 - "$OUT" "$RAW" "$(printf '%s\n' "${SERVER_LINES[@]}")" <<EOF
import json, sys
meta = {"meta": {"quick": $QUICK, "sessions": $SESSIONS, "pool_tokens": $POOL, "history_tokens": $HISTORY,
        "turns": $TURNS, "split_turn": $SPLIT, "concurrency": $CONCURRENCY, "max_tokens": $MAX_TOKENS,
        "seed": $SEED, "dtype": "$PEER_DTYPE", "kv_token_bytes": $KV_TOKEN_BYTES, "model_dir": "$HF_DIR",
        "llama_slots": $SLOTS, "llama_ctx": $LLAMA_CTX, "llama_cache_ram_mib": $LLAMA_CACHE_RAM_MIB,
        "commit": "$RS_COMMIT", "servers": sys.argv[3].splitlines()}}
with open(sys.argv[1], "a") as fh:
    fh.write(json.dumps(meta) + "\n")
EOF
"$RS_PY" - "$OUT" "$RAW" "$SPLIT" <<'EOF'
import json
import os
import sys

out, raw, split = sys.argv[1], sys.argv[2], int(sys.argv[3])
records = [r for r in map(json.loads, open(out)) if "label" in r]
systems: dict[str, list[dict]] = {}
for r in records:
    systems.setdefault(r["label"], []).append(r)


def pct(values, q):
    values = sorted(values)
    return values[min(len(values) - 1, round(q / 100 * (len(values) - 1)))] if values else None


def delta(runs, key):
    """A server counter's growth over the runs (each run: its server's end minus its start)."""
    states = [r["server_state"] for r in runs if r.get("server_state")]
    return sum((s["end"] or {}).get(key, 0) - (s["start"] or {}).get(key, 0) for s in states) if states else None


def restart_source(runs):
    """Where the first turn after the restart came from: the store's blocks indexed at start-up,
    the tier loads of that round, and the share of its prompts reported cached."""
    rest = [r for r in runs if r.get("phase") == "rest"]
    if not rest or not rest[0].get("server_state"):
        return "-"
    r, state = rest[0], rest[0]["server_state"]
    row = next((x for x in r["per_turn"] if x["turn"] == split + 1), None)
    after = state["rounds"].get(str(split + 1)) or state["end"] or {}
    loads = after.get("tier_loads", 0) - state["start"].get("tier_loads", 0)
    cached = f"{row['cached_share']:.0%}" if row and row["cached_share"] is not None else "-"
    return (f"{state['start'].get('tier_restored_blocks', 0)} blocks restored; {loads} loads for "
            f"{row['requests'] if row else 0} sessions, {cached} cached")


rows = []
for label, runs in systems.items():
    turns = [t for r in runs for t in r.get("returning_turns", [])]
    ttfts = [t[1] for t in turns if t[1] is not None]
    reported = [t for t in turns if t[3] is not None]
    spans = [r["returning"] for r in runs if r.get("returning")]
    cpu = [json.load(open(os.path.join(raw, f"{name}.cpu.json"))) for name in (label, f"{label}-first", f"{label}-rest")
           if os.path.exists(os.path.join(raw, f"{name}.cpu.json"))]
    rows.append({
        "label": label, "n": len(ttfts), "failed": sum(r["failed"] for r in runs),
        "p50": pct(ttfts, 50), "p99": pct(ttfts, 99),
        "tok_s": sum(s["output_tok_s"] * s["span_s"] for s in spans) / max(sum(s["span_s"] for s in spans), 1e-9),
        "cached": sum(t[3] for t in reported) / sum(t[2] for t in reported) if reported else None,
        "loads": delta(runs, "tier_loads_chosen"), "recomputes": delta(runs, "tier_recomputes_chosen"),
        "restart": restart_source(runs),
        # The CPU that other processes took meanwhile (peers_table.py measure): over 5% is noise.
        "other_cpu": max((c.get("other_cpu_frac", 0) for c in cpu), default=None),
    })
base = next((r["p99"] for r in rows if r["label"] == "radixserve"), None)
print(f"\nReturning turns (2..T of each session), results: {out}")
print("| system | turns | TTFT p50 s | TTFT p99 s | p99 vs radixserve | out tok/s | cached | tier loads / recomputes chosen "
      "| first turn after restart | failed | other CPU |")
print("|---|---|---|---|---|---|---|---|---|---|---|")


def f(value, spec):
    return format(value, spec) if value is not None else "-"


for r in rows:
    ratio = f"{r['p99'] / base:.2f}x" if base and r["p99"] else "-"
    tier = f"{r['loads']} / {r['recomputes']}" if r["loads"] is not None else "-"
    print(f"| {r['label']} | {r['n']} | {f(r['p50'], '.3f')} | {f(r['p99'], '.3f')} | {ratio} | {r['tok_s']:.1f} "
          f"| {f(r['cached'], '.0%')} | {tier} | {r['restart']} | {r['failed']} | {f(r['other_cpu'], '.0%')} |")
EOF
