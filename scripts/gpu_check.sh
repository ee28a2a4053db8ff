#!/usr/bin/env bash
# The prepared device check for a lent GPU machine (one H100 or H200, 16 cores, no network;
# Python 3.12 with CUDA torch, nvcc and ninja preinstalled: no venv, no setup.sh). Stages run
# cheapest first, each under its own time bound, each writing to OUT_DIR as it finishes, so a run
# cut short still reports.
#
#   scripts/gpu_wheels.sh [EARLIER_OUT_DIR]    # here, first: the two wheels that machine lacks,
#                                              # and an earlier run's archives if named
#   scripts/gpu_check.sh OUT_DIR               # there: one `run` carrying .gpu-wheels, timeout_s 600
#   scripts/gpu_check.sh --dry-run OUT_DIR     # here, on CPU: every stage's code path with
#                                              # FlashInfer's stand-ins; part of make test
#
# What it costs in device time. A task has 15 minutes in all, start-ups included. A machine takes
# a minute or more to start, starts only with 4 minutes left, stays warm 30 s after a call and
# then goes back; one command runs 10 minutes at most; a call carries 64 MiB at most.
# - A run: a start-up (1-3 min), the stages (at most their bounds' sum below, 8.1 min) and 30 s
#   warm unless given back at once: 9.6 to 11.6 minutes, leaving 3.4 to 5.4.
# - A rerun, once the results are read, finds the machine gone: another start-up, then the
#   stages at their bounds but for the compile, which takes seconds from the first run's
#   archives: about 4.3 min, so 5.8 to 7.8 minutes in all, more than a run at its bounds leaves.
#   Both runs fit in the 15 minutes only if their stages together take under 14 minutes less two
#   start-ups (8 to 12), that is, if the first run ends well inside its bounds. Otherwise a rerun
#   needs another task's 15 minutes, carrying this run's archives (gpu_wheels.sh OUT_DIR).
#
# OUT_DIR gets log.txt (every stage's output), results.jsonl (one record per result, stages
# included), summary.txt, and aot-*.tar.xz: the FlashInfer modules the compile stage built.
# `scripts/gpu_wheels.sh OUT_DIR` puts those in .gpu-wheels/aot/, and a second run loads them
# instead of compiling (its compile stage then takes seconds).
set -uo pipefail

# The plan: stage:bound in seconds, in order. The compile builds 28 .cu files in one ninja run
# over 16 jobs for sm_90a; 16 of them are FA2 prefill kernel files (8 per head size), long nvcc
# jobs that run side by side, so the build lasts about one of those after a light job: the bound
# leaves a third over the longest estimate of that. The other bounds are the dry run's stage
# times scaled for CUDA start-up (5-10 s per process) plus the real shapes' work. Their sum stays
# inside one command's 10 minutes with time to summarize.
PLAN="environment:15 wheels:25 compile:240 plan:30 backends:60 graphs:40 speed:40 gpu_tests:35"
PLAN_LIMIT_S=490

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DRY=0
if [ "${1:-}" = "--dry-run" ]; then DRY=1; shift; fi
OUT="${1:?usage: scripts/gpu_check.sh [--dry-run] OUT_DIR}"
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
cd "$ROOT"
: > "$OUT/log.txt"
: > "$OUT/results.jsonl"

PY="${PYTHON:-}"
if [ -z "$PY" ]; then
    if [ "$DRY" = 1 ] && [ -x "$ROOT/.venv/bin/python" ]; then PY="$ROOT/.venv/bin/python"; else PY="$(command -v python3)"; fi
fi
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
WHEELS="$ROOT/.gpu-wheels"
export MAX_JOBS="${MAX_JOBS:-$(nproc)}"  # FlashInfer's ninja jobs
# FlashInfer's JIT directory (created at import) and the nvcc it uses. A dry run gets its own, so
# no earlier run's libraries hide a stage that would compile.
if [ "$DRY" = 1 ]; then
    FLASHINFER_WORKSPACE_BASE="$(mktemp -d)"
    trap 'rm -rf "$FLASHINFER_WORKSPACE_BASE"' EXIT
fi
export FLASHINFER_WORKSPACE_BASE="${FLASHINFER_WORKSPACE_BASE:-${TMPDIR:-/tmp}/radixserve-flashinfer}"
if [ -z "${CUDA_HOME:-}" ] && [ -x /usr/local/cuda/bin/nvcc ]; then export CUDA_HOME=/usr/local/cuda; fi

environment() {
    echo "date: $(date -u +%FT%TZ)   dry run: $DRY   MAX_JOBS=$MAX_JOBS   CUDA_HOME=${CUDA_HOME:-unset}"
    uname -a
    command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
    if command -v nvcc >/dev/null; then nvcc --version | tail -2
    elif [ -n "${CUDA_HOME:-}" ]; then "$CUDA_HOME/bin/nvcc" --version | tail -2
    else echo "nvcc: not found"; fi
    "$PY" -c "import sys, torch; print(sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.version.cuda, 'available', torch.cuda.is_available())"
}

wheels() {
    [ "$DRY" = 1 ] && { echo "dry run: the venv has what it needs"; return 0; }
    ls "$WHEELS"/*.whl >/dev/null 2>&1 || { echo "no wheels in $WHEELS: run scripts/gpu_wheels.sh here first"; return 1; }
    if "$PY" -m pip --version >/dev/null 2>&1; then
        "$PY" -m pip install --quiet --no-index --no-deps --no-compile --target "$WHEELS/site" "$WHEELS"/*.whl
    else  # no pip in the image: a wheel is a zip of what goes into site-packages (the image has ninja)
        echo "no pip: unpacking the wheels"
        "$PY" -c 'import sys, zipfile; [zipfile.ZipFile(w).extractall(sys.argv[1]) for w in sys.argv[2:]]' \
            "$WHEELS/site" "$WHEELS"/*.whl
    fi
}

python_stage() {
    local args=("$1" --stage "$2")
    [ "$DRY" = 1 ] && args+=(--dry-run)
    [ "$2" = compile ] && [ "$DRY" = 0 ] && args+=(--archives "$WHEELS/aot")
    "$PY" scripts/gpu_check.py "${args[@]}"
}

gpu_tests() {
    [ "$DRY" = 1 ] && { echo "dry run: the GPU tests run only on a GPU"; return 0; }
    # Only the modules that hold GPU tests: collecting the whole suite imports clients the image
    # lacks (openai, anthropic), and one collection error stops the run
    # (tests/scripts/test_gpu_check.py checks these modules do not need them).
    mapfile -t GPU_TESTS < <(grep -rl --include='test_*.py' '^@pytest.mark.gpu' tests | sort)
    "$PY" -m pytest -q -p no:cacheprovider -m gpu "${GPU_TESTS[@]}"
}

# One stage under its bound: its output to log.txt, its status and time to results.jsonl.
run_stage() {
    local name="$1" bound="$2" start rc
    start=$(date +%s.%N)
    echo "=== $name (bound ${bound}s)" >> "$OUT/log.txt"
    case "$name" in
        environment|wheels|gpu_tests) export -f "$name"; export DRY PY WHEELS
            timeout "$bound" bash -c "$name" >> "$OUT/log.txt" 2>&1 ;;
        *) timeout "$bound" bash -c 'python_stage "$0" "$1"' "$OUT" "$name" >> "$OUT/log.txt" 2>&1 ;;
    esac
    rc=$?
    local took status=ok
    took=$(awk -v s="$start" -v e="$(date +%s.%N)" 'BEGIN { printf "%.1f", e - s }')
    [ "$rc" = 0 ] || status=FAIL
    printf '{"kind": "stage", "status": "%s", "ok": %s, "stage": "%s", "s": %s, "bound_s": %s, "timed_out": %s, "rc": %s}\n' \
        "$status" "$([ $rc = 0 ] && echo true || echo false)" "$name" "$took" "$bound" \
        "$([ $rc = 124 ] && echo true || echo false)" "$rc" >> "$OUT/results.jsonl"
    echo "gpu_check: $name $status in ${took}s (bound ${bound}s)"
}
export -f python_stage
export DRY PY WHEELS

total=0
for entry in $PLAN; do total=$((total + ${entry#*:})); done
echo "gpu_check: plan ${PLAN// /, } = ${total}s of ${PLAN_LIMIT_S}s"
[ "$total" -le "$PLAN_LIMIT_S" ] || { echo "gpu_check: the plan exceeds ${PLAN_LIMIT_S}s"; exit 2; }
[ "$DRY" = 0 ] && [ -d "$WHEELS/site" ] && export PYTHONPATH="$WHEELS/site:$PYTHONPATH" PATH="$WHEELS/site/bin:$PATH"
for entry in $PLAN; do
    run_stage "${entry%%:*}" "${entry#*:}"
    # The wheels land in site/ during their stage: the later stages import from there.
    [ "${entry%%:*}" = wheels ] && [ "$DRY" = 0 ] && export PYTHONPATH="$WHEELS/site:$PYTHONPATH" PATH="$WHEELS/site/bin:$PATH"
done
"$PY" scripts/gpu_check.py "$OUT" --summarize
status=$?
tail -1 "$OUT/summary.txt"
echo "gpu_check: $( [ $status = 0 ] && echo passed || echo FAILED ); results in $OUT"
exit $status
