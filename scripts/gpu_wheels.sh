#!/usr/bin/env bash
# Fetch here, into the ignored .gpu-wheels/, the wheels the lent GPU machine lacks (it has Python
# 3.12, CUDA torch, nvcc, aiohttp, uvloop, transformers and safetensors, and no network), so
# `run` can carry them there (64 MiB at most) and scripts/gpu_check.sh installs them offline.
#   scripts/gpu_wheels.sh
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="$ROOT/.gpu-wheels"
PY="${PYTHON:-$ROOT/.venv/bin/python}"
# The versions the GPU code was written against (pyproject's gpu extra pins the same flashinfer).
FLASHINFER="flashinfer-python==0.6.18.post1"
# Ours, then flashinfer's declared needs that the fa2 / CUDA-core paths import. nvidia-cutlass-dsl
# (hundreds of MB; imported only for backend="cute-dsl") and the prebuilt kernel packages are left
# out: the kernels are JIT-built there with its nvcc.
PACKAGES=(pyzmq orjson xgrammar "$FLASHINFER" "apache-tvm-ffi>=0.1.6,<0.2" ninja einops click tabulate
          nvidia-ml-py "packaging>=24.2" tqdm requests nvidia-cudnn-frontend)  # numpy: with transformers
mkdir -p "$OUT"
for pkg in "${PACKAGES[@]}"; do
    "$PY" -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
        --dest "$OUT" "$pkg"
done
du -ch "$OUT"/*.whl | tail -1
