"""Our C++ CPU kernels (kernels/csrc/): built once at setup, loaded without a compiler.

`runtime/execution/cpu_kernels.py` decides where the build lives and whether to use it; this module
knows how to build one, what CPU a build needs, and how to import it.

A build targets a `-march`: the CPU it runs on (`native`) or `x86-64-v3` (AVX2 + FMA, no AVX-512:
what an AVX2-only CPU such as AMD Zen 2/3 runs, and what qemu's EPYC-Rome executes, so its code is
tested for real on any x86-64 machine). The quant GEMM's ISA variants are the exception: each is
its own translation unit compiled with only its own flags, whatever the build's -march, so the
AVX2 variant cannot hold an AVX-512 instruction and both are in every build, chosen per call.

Each build folder holds `build.json`: the CPU features its code needs, read from the compiler's
own macros for the build's flags. `import_built` checks them against this CPU's (cpuid, as torch
reads it) and refuses a build the CPU cannot run with a message saying what is missing, instead
of the SIGILL the first such instruction would raise.
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import json
import os
import shutil
import subprocess
import sysconfig
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import ModuleType

import torch

NAME = "radixserve_cpu_kernels"
CSRC = Path(__file__).parent / "csrc"
# Each source, and its own -march flags where it must not take the build's (None: the build's).
SOURCES: dict[str, tuple[str, ...] | None] = {
    "module.cpp": None,
    "cascade_attention.cpp": None,
    "decode_attention.cpp": None,
    "decode_layer.cpp": None,
    "dense_gemv.cpp": None,
    "prefill_attention.cpp": None,
    "elementwise.cpp": None,
    "quant_gemm.cpp": None,
    "quant_gemm_avx2.cpp": ("-march=x86-64-v3",),
    "quant_gemm_avx512.cpp": ("-march=x86-64-v4", "-mavx512vnni"),
}
HEADERS = (  # in the key
    "kernels.h", "vec8.h", "quant_gemm_groups.h", "quant_gemm_kgroups.h", "quant_gemm_variants.h",
)
# -ffast-math: glibc declares its vector exp (libmvec) only under it; without it every score's
# exp is a scalar call, which was most of the kernel's time. The kernel has no inf/nan inputs.
CFLAGS = ("-O3", "-fopenmp", "-ffast-math", "-fPIC", "-std=c++20")
MARCHES = ("native", "x86-64-v3")
MANIFEST = "build.json"
CXX = os.environ.get("CXX", "c++")

# The compiler's ISA macros, by the name torch.cpu.get_capabilities() gives the feature.
FEATURE_MACROS = {
    "__AVX__": "avx", "__AVX2__": "avx2", "__FMA__": "fma3", "__F16C__": "f16c", "__BMI2__": "bmi2",
    "__AVX512F__": "avx512_f", "__AVX512CD__": "avx512_cd", "__AVX512DQ__": "avx512_dq",
    "__AVX512BW__": "avx512_bw", "__AVX512VL__": "avx512_vl", "__AVX512IFMA__": "avx512_ifma",
    "__AVX512VBMI__": "avx512_vbmi", "__AVX512VBMI2__": "avx512_vbmi2", "__AVX512BITALG__": "avx512_bitalg",
    "__AVX512VPOPCNTDQ__": "avx512_vpopcntdq", "__AVX512VNNI__": "avx512_vnni", "__AVX512BF16__": "avx512_bf16",
    "__AVX512FP16__": "avx512_fp16", "__AVXVNNI__": "avx_vnni", "__AMX_TILE__": "amx_tile",
    "__AMX_INT8__": "amx_int8", "__AMX_BF16__": "amx_bf16",
}


class IncompatibleBuild(RuntimeError):
    """The build's code needs CPU features this CPU lacks."""


def march_flags(march: str) -> tuple[str, ...]:
    assert march in MARCHES, f"unknown -march {march!r}; known: {MARCHES}"
    return (f"-march={march}",)


def source_flags(name: str, march: str) -> tuple[str, ...]:
    """The flags `name` is compiled with in a build for `march`."""
    own = SOURCES[name]
    if own is None:
        return (*CFLAGS, *march_flags(march))
    return (*CFLAGS, *own, *(("-mtune=native",) if march == "native" else ()))


def build_key(cpu: str, march: str = "native") -> str:
    """The build folder's name for these sources, this torch, `march` and the CPU described by `cpu`."""
    digest = hashlib.sha256()
    for name in [*SOURCES, *HEADERS]:
        digest.update((CSRC / name).read_bytes())
    flags = [" ".join(source_flags(name, march)) for name in SOURCES]
    digest.update("\n".join([torch.__version__, *flags, cpu]).encode())
    return f"{NAME}-{digest.hexdigest()[:16]}"


def built_module(folder: Path) -> Path | None:
    found = sorted(folder.glob(f"{NAME}*.so"))
    return found[0] if found else None


def cpu_features() -> frozenset[str]:
    """The features this CPU reports through cpuid (true under qemu too, unlike /proc/cpuinfo)."""
    return frozenset(name for name, value in torch.cpu.get_capabilities().items() if value is True)


def required_features(flags: tuple[str, ...]) -> frozenset[str]:
    """The CPU features code compiled with `flags` may use, from the compiler's predefined macros."""
    out = subprocess.run([CXX, *flags, "-dM", "-E", "-x", "c++", os.devnull], capture_output=True, text=True,
                         check=True).stdout
    defined = {line.split()[1] for line in out.splitlines() if line.startswith("#define ")}
    return frozenset(feature for macro, feature in FEATURE_MACROS.items() if macro in defined)


def manifest(folder: Path) -> dict:
    return json.loads((folder / MANIFEST).read_text())


def missing_features(folder: Path, have: frozenset[str] | None = None) -> list[str]:
    """The features the build in `folder` needs and this CPU (or `have`) lacks."""
    needed = set(manifest(folder)["requires"])
    return sorted(needed - (cpu_features() if have is None else have))


def build(folder: Path, march: str = "native", verbose: bool = False) -> Path:
    """Compile the kernels into `folder` (a no-op when it holds the build); the module's path."""
    existing = built_module(folder)
    if existing is not None:
        return existing
    for stale in folder.parent.glob(f"{NAME}-*"):  # builds of older sources or another torch
        if stale != folder:
            shutil.rmtree(stale, ignore_errors=True)
    objects = folder / "objects"
    objects.mkdir(parents=True, exist_ok=True)
    includes = [f"-I{CSRC}", *(f"-isystem{p}" for p in _torch_include_dirs())]
    defines = [f"-DTORCH_EXTENSION_NAME={NAME}", "-DTORCH_API_INCLUDE_EXTENSION_H",
               f"-D_GLIBCXX_USE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}"]

    def compile_one(name: str) -> Path:
        obj = objects / f"{Path(name).stem}.o"
        _run([CXX, *source_flags(name, march), *defines, *includes, "-c", str(CSRC / name), "-o", str(obj)], verbose)
        return obj

    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        built = list(pool.map(compile_one, SOURCES))
    lib = Path(torch.__file__).parent / "lib"
    partial = folder / f".{NAME}.so.partial"
    _run([CXX, *map(str, built), "-shared", "-fopenmp", f"-L{lib}", f"-Wl,-rpath,{lib}", "-lc10", "-ltorch_cpu",
          "-ltorch", "-ltorch_python", "-o", str(partial)], verbose)
    (folder / MANIFEST).write_text(json.dumps({
        "march": march, "requires": sorted(required_features(march_flags(march))),
        "torch": torch.__version__}, indent=1))
    target = folder / f"{NAME}.so"
    os.replace(partial, target)  # last: a folder with the module holds its manifest
    shutil.rmtree(objects, ignore_errors=True)
    return target


def import_built(path: Path) -> ModuleType:
    """Import the compiled module at `path` (no compiler involved).

    Raises:
        IncompatibleBuild: the build needs CPU features this CPU lacks.
    """
    missing = missing_features(path.parent)
    if missing:
        march = manifest(path.parent)["march"]
        raise IncompatibleBuild(
            f"the C++ CPU kernels at {path} were built with -march={march} and need {', '.join(missing)}, which "
            f"this CPU does not report (cpuid): rebuild them on this machine (`make setup`), or use the AVX2 build "
            f"(RADIXSERVE_CPU_KERNELS_MARCH=x86-64-v3)")
    loader = importlib.machinery.ExtensionFileLoader(NAME, str(path))
    spec = importlib.util.spec_from_loader(NAME, loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def _torch_include_dirs() -> list[str]:
    include = Path(torch.__file__).parent / "include"
    return [str(include), str(include / "torch" / "csrc" / "api" / "include"), sysconfig.get_paths()["include"]]


def _run(cmd: list[str], verbose: bool) -> None:
    if verbose:
        print(" ".join(cmd), flush=True)
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"building the C++ CPU kernels failed: {' '.join(cmd)}\n{done.stdout}{done.stderr}")
