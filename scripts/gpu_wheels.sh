#!/usr/bin/env bash
# Fetch here, into the ignored .gpu-wheels/, the two wheels the lent GPU machine lacks for the
# check, so `run` can carry them there and scripts/gpu_check.sh installs them offline:
# flashinfer-python and the apache-tvm-ffi it needs, pinned. Everything else `import flashinfer`
# and the check import is in that machine's image (torch, numpy, nvidia-ml-py, requests, tqdm,
# packaging, jinja2, filelock, ninja, pytest), and nothing else is needed on the check's path:
# no pyzmq, orjson or xgrammar (tests/scripts/test_gpu_check.py follows the imports).
#   scripts/gpu_wheels.sh [--dry-run] [EARLIER_OUT_DIR]
# The folder is cleared first, so nothing stale travels. EARLIER_OUT_DIR: a check run's OUT_DIR,
# whose aot-*.tar.xz go to .gpu-wheels/aot/ (the compile stage then loads instead of building).
# --dry-run prints the downloads instead of running them. GPU_WHEELS_DIR overrides the folder.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${PYTHON:-$ROOT/.venv/bin/python}"
DRY=0
if [ "${1:-}" = "--dry-run" ]; then DRY=1; shift; fi
EARLIER="${1:-}"
OUT="${GPU_WHEELS_DIR:-$ROOT/.gpu-wheels}"
# flashinfer-python as pyproject's gpu extra pins it; apache-tvm-ffi within its requirement
# (>=0.1.6,<0.2, not 0.1.8): the version our CPU venv runs.
PINS=(flashinfer-python==0.6.18.post1 apache-tvm-ffi==0.1.15.post2)
# Of the 64 MiB a call carries, the working tree keeps the rest.
LIMIT_MIB=56

rm -rf "$OUT"
mkdir -p "$OUT"
for pin in "${PINS[@]}"; do
    cmd=("$PY" -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 --implementation cp
         --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64
         --dest "$OUT" "$pin")
    if [ "$DRY" = 1 ]; then echo "would run: ${cmd[*]}"; else "${cmd[@]}"; fi
done
if [ -n "$EARLIER" ]; then
    archives=("$EARLIER"/aot-*.tar.xz)
    [ -e "${archives[0]}" ] || { echo "gpu_wheels: no aot-*.tar.xz in $EARLIER" >&2; exit 1; }
    mkdir -p "$OUT/aot"
    cp "${archives[@]}" "$OUT/aot/"
fi
[ "$DRY" = 1 ] || [ "$(ls "$OUT"/*.whl | wc -l)" = "${#PINS[@]}" ] || { echo "gpu_wheels: expected ${#PINS[@]} wheels in $OUT" >&2; exit 1; }
size=$(du -sb "$OUT" | cut -f1)
echo "gpu_wheels: $OUT holds $(awk -v b="$size" 'BEGIN { printf "%.1f", b / 1048576 }') MiB of ${LIMIT_MIB} MiB"
[ "$size" -le $((LIMIT_MIB << 20)) ] || { echo "gpu_wheels: over ${LIMIT_MIB} MiB: leave some archives out" >&2; exit 1; }
