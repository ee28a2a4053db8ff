#!/usr/bin/env bash
# The prepared device check for a lent GPU machine (one H200, no network, Python 3.12 with CUDA
# torch and nvcc preinstalled). In under 8 minutes:
#   1. installs the wheels that machine lacks from .gpu-wheels/ (fetched here by
#      scripts/gpu_wheels.sh; pip install --no-index --no-deps --target .gpu-wheels/site);
#   2. runs scripts/gpu_check.py: FlashInfer against the torch backend on dummy weights of real
#      shapes (page sizes 1 and 16; prefill, cached prefix, chunked, mixed, 32 decode steps), CUDA
#      graphs against eager, decode tokens/s at batch 1/32/128/256 with graphs on and off;
#   3. runs the gpu-marked tests.
# Everything lands in OUT_DIR as it is produced (environment.txt, results.jsonl, summary.txt,
# gpu_tests.txt), so a run cut short still reports.
#
#   scripts/gpu_check.sh OUT_DIR             # on the GPU machine
#   scripts/gpu_check.sh --dry-run OUT_DIR   # here, on CPU: the same code path (tiny shapes, the
#                                            # torch backend, FlashInfer's stand-in); part of make test
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DRY=0
if [ "${1:-}" = "--dry-run" ]; then DRY=1; shift; fi
OUT="${1:?usage: scripts/gpu_check.sh [--dry-run] OUT_DIR}"
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
cd "$ROOT"

PY="${PYTHON:-}"
if [ -z "$PY" ]; then
    if [ "$DRY" = 1 ] && [ -x "$ROOT/.venv/bin/python" ]; then PY="$ROOT/.venv/bin/python"; else PY="$(command -v python3)"; fi
fi
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"

{
    echo "date: $(date -u +%FT%TZ)   dry run: $DRY"
    uname -a
    nproc
    command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
    command -v nvcc >/dev/null && nvcc --version | tail -2 || echo "nvcc: not on PATH (CUDA_HOME=${CUDA_HOME:-unset})"
    "$PY" -c "import sys, torch; print(sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.version.cuda, 'available', torch.cuda.is_available())"
} > "$OUT/environment.txt" 2>&1
cat "$OUT/environment.txt"

WHEELS="$ROOT/.gpu-wheels"
if [ "$DRY" = 0 ] && ls "$WHEELS"/*.whl >/dev/null 2>&1; then
    "$PY" -m pip install --quiet --no-index --no-deps --target "$WHEELS/site" "$WHEELS"/*.whl > "$OUT/wheels.txt" 2>&1 \
        || { echo "gpu_check: installing the wheels failed (see wheels.txt)"; tail -5 "$OUT/wheels.txt"; }
    export PYTHONPATH="$WHEELS/site:$PYTHONPATH"
    export PATH="$WHEELS/site/bin:$PATH"  # ninja, which FlashInfer's JIT runs
fi
# FlashInfer's JIT cache (it creates it at import) and build parallelism on the 16 cores.
export FLASHINFER_WORKSPACE_BASE="${FLASHINFER_WORKSPACE_BASE:-${TMPDIR:-/tmp}/radixserve-flashinfer}"
export MAX_JOBS="${MAX_JOBS:-16}"

status=0
ARGS=()
[ "$DRY" = 1 ] && ARGS+=(--dry-run)
timeout "${CHECK_TIMEOUT_S:-330}" "$PY" scripts/gpu_check.py "$OUT" "${ARGS[@]}" 2>&1 | tee "$OUT/gpu_check.txt"
[ "${PIPESTATUS[0]}" = 0 ] || status=1

if [ "$DRY" = 0 ]; then
    # Only the modules that hold GPU tests: collecting the whole suite imports clients the image
    # lacks (openai, anthropic), and one collection error stops the run
    # (tests/scripts/test_gpu_check.py checks these modules do not need them).
    mapfile -t GPU_TESTS < <(grep -rl --include='test_*.py' 'pytest.mark.gpu' tests | sort)
    timeout "${TESTS_TIMEOUT_S:-120}" "$PY" -m pytest -q -p no:cacheprovider -m gpu "${GPU_TESTS[@]}" \
        > "$OUT/gpu_tests.txt" 2>&1 || status=1
    tail -3 "$OUT/gpu_tests.txt"
fi
echo "gpu_check: $( [ $status = 0 ] && echo passed || echo FAILED ); results in $OUT"
exit $status
