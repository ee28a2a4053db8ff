"""When and how FlashInfer can run: the rules, apart from the backend so they are testable anywhere.

No torch or flashinfer import here: the rules take names and numbers, and the few probes of the
machine (`find_nvcc`, `has_prebuilt_kernels`) only look at files and installed packages.

Facts from FlashInfer 0.6.x's source that the rules encode:
- Its CUDA-core decode kernel dispatches only GQA group sizes 1, 2, 3, 4, 6 and 8
  (`DISPATCH_GQA_GROUP_SIZE` in include/flashinfer/utils.cuh of 0.6.18.post1); other groups raise
  "Unsupported group_size" in plan() (5 in Qwen2.5-14B, 7 in Qwen2.5-7B) and need the tensor-core decode,
  which runs the prefill kernels with one query per request. SGLang also prefers tensor cores
  from group 4 up in 16-bit KV (faster there).
- There are fp16 and bf16 kernels, no fp32 ones.
- Kernels are JIT-compiled with `nvcc` on first use unless they are prebuilt: in
  `flashinfer-jit-cache` (of the same version; not on PyPI, FlashInfer's own index has it) or in
  FlashInfer's AOT directory (kernels/flashinfer_jit.py puts them there). `flashinfer-cubin` does
  not count: it holds the TensorRT-LLM kernels, no FA2 attention, and stops at 0.6.13 (a cubin
  package of another version makes `import flashinfer` raise). FA3 prefill kernels (what `auto`
  picks on Hopper) take longest to build, so the prefill wrapper is pinned to FA2 as SGLang does.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import shutil
from types import ModuleType

CUDA_CORE_DECODE_GROUP_SIZES = frozenset({1, 2, 3, 4, 6, 8})
TENSOR_CORE_MIN_GROUP = 4  # SGLang's rule for 16-bit KV caches
SUPPORTED_DTYPES = ("bfloat16", "float16")
PREFILL_BACKEND = "fa2"
# FlashInfer's float workspace (split-KV partial outputs, plan info). SGLang allocates 384 MiB by
# default (its SGLANG_FLASHINFER_WORKSPACE_SIZE); too small a buffer fails at plan() for large
# batches with long contexts.
WORKSPACE_BYTES = 384 * 1024 * 1024
PREBUILT_PACKAGES = ("flashinfer_jit_cache",)


def decode_uses_tensor_cores(num_heads: int, num_kv_heads: int, kv_dtype: str) -> bool:
    """Whether the decode wrapper runs FlashInfer's tensor-core (prefill-kernel) decode."""
    group = num_heads // num_kv_heads
    if group not in CUDA_CORE_DECODE_GROUP_SIZES:
        return True
    return kv_dtype in SUPPORTED_DTYPES and group >= TENSOR_CORE_MIN_GROUP


def unsupported_dtype(dtype: str, kv_dtype: str) -> str | None:
    """Why FlashInfer cannot run this model dtype / KV dtype, or None when it can."""
    for what, name in (("dtype", dtype), ("kv_cache_dtype", kv_dtype)):
        if name not in SUPPORTED_DTYPES:
            return (f"FlashInfer has no {name} kernels ({what} {name}); it runs bfloat16 and float16: "
                    f"use --dtype bfloat16, or --attention-backend torch (much slower)")
    return None


def find_nvcc(env: dict[str, str] | None = None) -> str | None:
    """The nvcc FlashInfer's JIT would use: $CUDA_HOME/bin/nvcc (or CUDA_PATH), else the PATH."""
    env = dict(os.environ) if env is None else env
    for var in ("CUDA_HOME", "CUDA_PATH"):
        home = env.get(var)
        if home and os.access(os.path.join(home, "bin", "nvcc"), os.X_OK):
            return os.path.join(home, "bin", "nvcc")
    found = shutil.which("nvcc", path=env.get("PATH"))
    if found:
        return found
    default = "/usr/local/cuda/bin/nvcc"
    return default if os.access(default, os.X_OK) else None


def has_prebuilt_kernels() -> bool:
    """Whether a package of prebuilt FA2 attention kernels is installed (without importing it)."""
    return any(importlib.util.find_spec(name) is not None for name in PREBUILT_PACKAGES)


def jit_problem(nvcc: str | None, prebuilt: bool) -> str | None:
    """Why FlashInfer's kernels cannot be built or found here, or None."""
    if nvcc is not None or prebuilt:
        return None
    return ("FlashInfer compiles its kernels with nvcc on first use, and no nvcc was found (CUDA_HOME, "
            "PATH, /usr/local/cuda) nor a prebuilt kernel package: install the CUDA toolkit matching "
            "torch's CUDA (e.g. `apt install cuda-nvcc-13-0`, then set CUDA_HOME), or `pip install "
            "flashinfer-jit-cache` from FlashInfer's wheel index for your CUDA version, or use "
            "--attention-backend torch")


def import_flashinfer() -> ModuleType:
    """`import flashinfer`, with its RMSNorm on the CUDA kernels it JIT-builds (the module
    kernels/flashinfer_jit.py builds ahead of time) rather than the CuTe DSL ones, which it picks
    when nvidia-cutlass-dsl is installed and which compile at run time. Set before the first import:
    flashinfer.norm reads FLASHINFER_USE_CUDA_NORM when it is imported."""
    os.environ.setdefault("FLASHINFER_USE_CUDA_NORM", "1")
    return importlib.import_module("flashinfer")
