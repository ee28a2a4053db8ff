#!/usr/bin/env bash
# The C++ kernel tests on an AVX2-only CPU, for real: qemu-user's EPYC-Rome (Zen 2: AVX2 and FMA,
# no AVX-512) executes the kernels' x86-64-v3 build, so any AVX-512 instruction that reaches it
# (ours, torch's or oneDNN's) is a SIGILL, not a silent pass. `make test` runs it after pytest.
#
#   bash scripts/test_avx2.sh [pytest args]     (default: the C++ kernels' tests, KERNEL_TESTS)
#
# It installs Debian's qemu-user when it is missing and it can (root with apt-get); elsewhere it
# says how and fails. Under emulation everything runs 10-50x slower: only small kernel tests.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VPY="$ROOT/.venv/bin/python"
cd "$ROOT"
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"  # this tree's code, even where .venv's editable install points elsewhere

if ! command -v qemu-x86_64 >/dev/null 2>&1; then
    if [[ $(id -u) == 0 ]] && command -v apt-get >/dev/null 2>&1; then
        echo "test_avx2: installing Debian's qemu-user" >&2
        apt-get install -y -qq qemu-user >/dev/null 2>&1 \
            || { apt-get update -qq >/dev/null && apt-get install -y -qq qemu-user >/dev/null; }
    else
        echo "test_avx2: qemu-x86_64 is missing: install qemu-user (Debian: apt-get install qemu-user)" >&2
        exit 1
    fi
fi

native="$("$VPY" -c 'from kernels import cpu_ext; from runtime.execution.cpu_kernels import kernels_dir
p = cpu_ext.built_module(kernels_dir()); print(p or "")')"
export RADIXSERVE_CPU_KERNELS_MARCH=x86-64-v3
"$VPY" -m runtime.execution.cpu_kernels build >/dev/null  # natively: compiling under qemu takes minutes
# qemu warns once per CPUID feature of EPYC-Rome that its TCG lacks (rdseed, sha-ni, ...): noise.
quiet() { grep -v "TCG doesn't support requested feature" >&2 || true; }
emulated() { qemu-x86_64 -cpu EPYC-Rome "$VPY" "$@" 2> >(quiet); }

KERNEL_TESTS=(tests/kernels/csrc tests/runtime/execution/test_cpu_kernels.py)
if [[ $# -eq 0 ]]; then set -- "${KERNEL_TESTS[@]}"; fi
# One emulated interpreter for both (torch takes about 12 s to import under qemu): the probe, then pytest.
emulated -c 'import runpy, sys
native, tests = sys.argv[1], sys.argv[2:]
sys.argv = ["avx2_probe.py", *([native] if native else [])]
try:
    runpy.run_path("scripts/avx2_probe.py", run_name="__main__")
except SystemExit as probe:
    if probe.code:
        raise
import pytest
sys.exit(pytest.main(["-q", "-p", "no:cacheprovider", *tests]))' "$native" "$@"
