"""What an AVX2-only CPU sees, checked under qemu-x86_64 -cpu EPYC-Rome (scripts/test_avx2.sh).

Prints one line per fact and exits non-zero unless: torch dispatches to AVX2, the CPU reports
no AVX-512 (cpuid), the kernels that load are the x86-64-v3 build, the block GEMM takes its AVX2
variant, and the native build named as an argument (if any) is refused by its manifest, not by a
SIGILL, when it needs a feature this CPU lacks.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from kernels import cpu_ext
from runtime.execution.cpu_kernels import load_cpu_kernels
from runtime.execution.device import cpu_capability


def main(native: Path | None) -> int:
    failures = []
    isa = torch.backends.cpu.get_cpu_capability()
    print(f"avx2 probe: torch dispatches to {isa}; cpuid: {cpu_capability().describe()}")
    if isa != "AVX2" or "avx512_f" in cpu_ext.cpu_features():
        failures.append("this is not an AVX2-only CPU")
    module = load_cpu_kernels()
    march = cpu_ext.manifest(Path(module.__file__).parent)["march"] if module is not None else None
    print(f"avx2 probe: kernels {module.__file__ if module else None} (-march={march}); "
          f"block GEMM variant {cpu_capability().block_kernel_isa}")
    if march != "x86-64-v3" or cpu_capability().block_kernel_isa != "avx2":
        failures.append("the x86-64-v3 build and the AVX2 variant did not load")
    if native is not None:
        failures += _native_verdict(native)
    for failure in failures:
        print(f"avx2 probe FAILED: {failure}")
    return 1 if failures else 0


def _native_verdict(native: Path) -> list[str]:
    missing = cpu_ext.missing_features(native.parent)
    try:
        cpu_ext.import_built(native)
    except cpu_ext.IncompatibleBuild as refused:
        print(f"avx2 probe: the native build is refused: {refused}")
        return [] if missing else ["a native build this CPU can run was refused"]
    print("avx2 probe: the native build loads (it needs nothing this CPU lacks)")
    return ["a native build needing " + ", ".join(missing) + " was not refused"] if missing else []


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1]) if len(sys.argv) > 1 else None))
