#!/usr/bin/env bash
# The prepared device check for a lent GPU machine (one H200, 16 cores, no network; Python 3.12
# with CUDA torch, nvcc and ninja preinstalled: no venv, no setup.sh). Stages run cheapest first,
# each under its own time bound, each writing to OUT_DIR as it finishes, so a run cut short still
# reports; the bounds add up to the 8-minute plan below (a rerun fits in the same 15 minutes).
#
#   scripts/gpu_wheels.sh                      # here, first: the wheels that machine lacks
#   scripts/gpu_check.sh OUT_DIR               # there (the run tool carries .gpu-wheels/)
#   scripts/gpu_check.sh --dry-run OUT_DIR     # here, on CPU: every stage's code path with
#                                              # FlashInfer's stand-ins; part of make test
#
# OUT_DIR gets log.txt (every stage's output), results.jsonl (one record per result, stages
# included), summary.txt, and aot-*.tar.xz: the FlashInfer modules the compile stage built. Put
# those in .gpu-wheels/aot/ and a second run loads them instead of compiling (its compile stage
# then takes seconds).
set -uo pipefail

# The plan: stage:bound in seconds, in order. The compile bound assumes about 30 s per attention
# module built alone (FlashInfer issue #1038: 28 s for a decode and 31 s for a prefill module,
# head_dim 64, on the reporter's GPU machine) and at most 10 s for each of the four one- or
# two-file modules (norm, rope, silu_and_mul, sampling): 160 s for our eight even if ninja ran
# them one after another. They build in one ninja run over 16 jobs (about 28 .cu files), for
# sm_90 only. The other bounds are the dry run's stage times scaled for CUDA start-up (5-10 s per
# process) plus the work.
PLAN="environment:20 wheels:40 compile:200 plan:30 backends:60 graphs:45 speed:50 gpu_tests:35"
PLAN_LIMIT_S=480

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
# FlashInfer's JIT directory (created at import) and the nvcc it uses.
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
        "$PY" -m pip install --quiet --no-index --no-deps --target "$WHEELS/site" "$WHEELS"/*.whl
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
