"""Where our C++ CPU kernels are built and whether serving uses them.

    python -m runtime.execution.cpu_kernels build     # scripts/setup.sh runs it (about 20 s, once)
    ext = load_cpu_kernels()                # the module, or None: then the torch path runs

Builds live in `<RADIXSERVE_CACHE_DIR>/ext/<key>/` (see kernels/cpu_ext.py for the key).
Serving never compiles: without a build it logs one warning and uses the torch path; a build this
CPU cannot run (kernels/cpu_ext.py IncompatibleBuild) is refused with an error naming what it
lacks. `RADIXSERVE_CPU_KERNELS=0` turns the kernels off. `RADIXSERVE_CPU_KERNELS_MARCH=x86-64-v3`
builds and loads the AVX2 build instead of the native one (in `ext/x86-64-v3/<key>/`, so neither
build clears the other): the suite runs the kernel tests with it under qemu's EPYC-Rome CPU
(scripts/test_avx2.sh), so the kernels' AVX2 code really runs there.
"""

from __future__ import annotations

import functools
import logging
import sys
from pathlib import Path
from types import ModuleType

from kernels import cpu_ext
from runtime.contracts import env

logger = logging.getLogger("radixserve.kernels")


def kernels_dir() -> Path:
    """The build folder for this machine. A native build is keyed by the CPU's features (cpuid), so
    another CPU, an emulated one included, never finds it; the x86-64-v3 build does not depend on
    the CPU it was built on, so every CPU finds the same one."""
    march = kernels_march()
    features = " ".join(sorted(cpu_ext.cpu_features())) if march == "native" else ""
    root = env.cache_dir() / "ext"
    return (root if march == "native" else root / march) / cpu_ext.build_key(features, march)


def kernels_march() -> str:
    """The -march of the build to use (`RADIXSERVE_CPU_KERNELS_MARCH`, default native)."""
    march = env.get_str("CPU_KERNELS_MARCH", "native")
    if march not in cpu_ext.MARCHES:
        raise ValueError(f"RADIXSERVE_CPU_KERNELS_MARCH must be one of {cpu_ext.MARCHES}, got {march!r}")
    return march


def cpu_kernels_built() -> bool:
    """Whether load_cpu_kernels would load them (without loading them into this process)."""
    return env.get_bool("CPU_KERNELS", True) and cpu_ext.built_module(kernels_dir()) is not None


@functools.cache
def load_cpu_kernels() -> ModuleType | None:
    if not env.get_bool("CPU_KERNELS", True):
        return None
    path = cpu_ext.built_module(kernels_dir())
    if path is None:
        logger.warning("the C++ CPU kernels are not built (run `make setup`); using the slower torch path")
        return None
    return cpu_ext.import_built(path)


if __name__ == "__main__":
    if sys.argv[1:2] != ["build"]:
        raise SystemExit("usage: python -m runtime.execution.cpu_kernels build [-v]")
    print(cpu_ext.build(kernels_dir(), kernels_march(), verbose="-v" in sys.argv))
