"""Our C++ CPU kernels (kernels/csrc/): built once at setup, loaded without a compiler.

`runtime/execution/cpu_kernels.py` decides where the build lives and whether to use it; this module only
knows how to build and import it. The key of a build folder covers the sources, the torch
version, the compiler flags and the CPU's flags (it is built for the CPU it runs on,
`-march=native`, or for AVX2 with `-march=x86-64-v3`), so a stale or foreign build is never loaded.
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import shutil
from pathlib import Path
from types import ModuleType

import torch

NAME = "radixserve_cpu_kernels"
SOURCES = [Path(__file__).parent / "csrc" / name
           for name in ("module.cpp", "cascade_attention.cpp", "decode_attention.cpp", "decode_layer.cpp",
                        "dense_gemv.cpp", "prefill_attention.cpp", "elementwise.cpp", "quant_gemm.cpp")]
HEADERS = [Path(__file__).parent / "csrc" / name  # in the key
           for name in ("kernels.h", "vec8.h", "quant_gemm_groups.h")]
# -ffast-math: glibc declares its vector exp (libmvec) only under it; without it every score's
# exp is a scalar call, which was most of the kernel's time. The kernel has no inf/nan inputs.
CFLAGS = ["-O3", "-fopenmp", "-ffast-math"]
LDFLAGS = ["-fopenmp"]
# -march values a build may target: the CPU it runs on, or x86-64-v3 (AVX2 + FMA, no AVX-512:
# what an AVX2-only CPU such as AMD Zen 2/3 runs), which a bigger CPU can build and execute for
# real, so the AVX2 code paths of our kernels are tested on any x86-64 machine we have.
MARCHES = ("native", "x86-64-v3")


def cflags(march: str) -> list[str]:
    assert march in MARCHES, f"unknown -march {march!r}; known: {MARCHES}"
    return [*CFLAGS, f"-march={march}"]


def build_key(cpu: str, march: str = "native") -> str:
    """The build folder's name for these sources, this torch, `march` and the CPU described by `cpu`."""
    digest = hashlib.sha256()
    for src in [*SOURCES, *HEADERS]:
        digest.update(src.read_bytes())
    digest.update(" ".join([torch.__version__, *cflags(march), cpu]).encode())
    return f"{NAME}-{digest.hexdigest()[:16]}"


def built_module(folder: Path) -> Path | None:
    found = sorted(folder.glob(f"{NAME}*.so"))
    return found[0] if found else None


def build(folder: Path, march: str = "native", verbose: bool = False) -> Path:
    """Compile the kernels into `folder` (a no-op when it holds the build); the module's path."""
    existing = built_module(folder)
    if existing is not None:
        return existing
    from torch.utils.cpp_extension import load as compile_and_load

    for stale in folder.parent.glob(f"{NAME}-*"):  # builds of older sources or another torch
        if stale != folder:
            shutil.rmtree(stale, ignore_errors=True)
    folder.mkdir(parents=True, exist_ok=True)
    compile_and_load(NAME, [str(s) for s in SOURCES], build_directory=str(folder), extra_cflags=cflags(march),
                     extra_ldflags=LDFLAGS, verbose=verbose)
    built = built_module(folder)
    assert built is not None, f"the build left no {NAME}*.so in {folder}"
    return built


def import_built(path: Path) -> ModuleType:
    """Import the compiled module at `path` (no compiler involved)."""
    loader = importlib.machinery.ExtensionFileLoader(NAME, str(path))
    spec = importlib.util.spec_from_loader(NAME, loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module
