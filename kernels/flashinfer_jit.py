"""FlashInfer's kernels for our models, built ahead of time in one parallel build.

FlashInfer 0.6.x compiles each kernel module with nvcc the first time a call needs it (an
attention module per dtype and head size is about 10 `.cu` files, half a minute or more), one
module after another, inside the first request. `build_modules` builds exactly the modules our
calls will ask for, all in one ninja run (`build_jit_specs`, FlashInfer's own AOT entry point,
parallel over MAX_JOBS), so serving and the GPU check pay the compile once, up front, in about
the time of the slowest module.

Which modules (FlashInfer 0.6.18's, as our code calls it: int32 indices, no positional encoding,
sliding window or soft cap in attention, o dtype = q dtype), for given attention layouts:
- `batch_prefill_..._f16qk_False` (FA2) per head size: the prefill wrapper, and also the
  tensor-core decode (decode.py's plan builds it through get_batch_prefill_module("fa2", ...));
- `batch_decode_...` per head size, only for a layout whose decode runs on CUDA cores
  (flashinfer_support.decode_uses_tensor_cores: GQA groups 1, 2, 3 in 16-bit KV);
- `norm`, `rope`, `silu_and_mul`: the fused per-token ops (kernels/flashinfer_ops.py; norm on
  its CUDA kernels, see flashinfer_support.import_flashinfer), and, when asked for, `sampling`:
  the sort-free top-k/top-p draws (kernels/flashinfer_sampling.py).

Where the libraries must end up: a call loads a module through `build_and_load()`, whose
`try_load()` accepts only a library in FlashInfer's AOT directory
(`flashinfer/data/aot/<name>/<name>.so`). A library left where `build_jit_specs` built it
(`cached_ops/<name>/`) is rebuilt from scratch by that call: ninja ran from `cached_ops/`, so its
log is there and the module's own folder has none. So each built library is copied into the AOT
directory, as FlashInfer's aot.py does (`copy_built_kernels`); scripts/gpu_compile.py also unpacks
the archives of an earlier run there, and those modules are not rebuilt.
"""

from __future__ import annotations

import dataclasses
import importlib
import shutil
import tarfile
import time
from pathlib import Path
from typing import Any

import torch

from kernels.flashinfer_support import decode_uses_tensor_cores

# After the dtypes and head sizes, gen_batch_prefill_module / gen_batch_decode_module take
# pos_encoding_mode (0: NONE), use_sliding_window, use_logits_soft_cap and (prefill only)
# use_fp16_qk_reduction. Our plan() calls leave all of them at their defaults, except for a model
# with a sliding window or attention soft cap (Mistral v0.1, Phi-3-mini-4k, Gemma): those variants
# are not built here, and FlashInfer compiles them on first use.
_POS_ENCODING_NONE = 0
FUSED_OPS = ("norm", "rope", "silu_and_mul")
ELEMENTWISE = (*FUSED_OPS, "sampling")


@dataclasses.dataclass(frozen=True)
class KernelModule:
    """One FlashInfer kernel module our code needs."""

    kind: str  # "prefill" (FA2; also the tensor-core decode), "decode" (CUDA cores), or ELEMENTWISE
    head_dim: int = 0  # attention only
    dtype: torch.dtype | None = None  # attention only

    @property
    def label(self) -> str:
        """A short file-name-safe label ("prefill-hd128-bfloat16", "norm")."""
        if self.kind in ELEMENTWISE:
            return self.kind
        return f"{self.kind}-hd{self.head_dim}-{str(self.dtype).removeprefix('torch.')}"

    @property
    def group(self) -> str:
        """The archive it travels in: one per head size, one for the per-token ops."""
        return "elementwise" if self.kind in ELEMENTWISE else f"attention-hd{self.head_dim}"

    def spec(self, jit: Any) -> Any:
        """The module's JitSpec from `jit` (flashinfer.jit, or its stand-in)."""
        if self.kind in ELEMENTWISE:
            return _elementwise_spec(jit, self.kind)
        dtypes = (self.dtype, self.dtype, self.dtype, torch.int32)
        common = (self.head_dim, self.head_dim, _POS_ENCODING_NONE, False, False)
        if self.kind == "prefill":
            return jit.gen_batch_prefill_module("fa2", *dtypes, *common, False)
        return jit.gen_batch_decode_module(*dtypes, *common)


def _elementwise_spec(jit: Any, kind: str) -> Any:
    if kind == "silu_and_mul":
        return importlib.import_module(f"{jit.__name__}.activation").gen_act_and_mul_module("silu")
    return getattr(importlib.import_module(f"{jit.__name__}.{kind}"), f"gen_{kind}_module")()


@dataclasses.dataclass(frozen=True)
class AttentionLayout:
    """A model's attention heads: what picks its decode kernels and its modules' head size."""

    heads: int
    kv_heads: int
    head_dim: int


def needed_modules(layouts: list[AttentionLayout], dtypes: list[torch.dtype], fused_ops: bool = True,
                   sampling: bool = False) -> list[KernelModule]:
    """The modules these layouts load in these dtypes: FA2 prefill per head size, the CUDA-core
    decode per head size that some layout decodes on CUDA cores, the fused ops, and the sampler's
    module only when asked for (greedy and full-vocabulary draws never load it)."""
    modules = []
    for head_dim in sorted({layout.head_dim for layout in layouts}):
        for dtype in dtypes:
            kv_dtype = str(dtype).removeprefix("torch.")
            cuda_core = any(layout.head_dim == head_dim and not decode_uses_tensor_cores(
                layout.heads, layout.kv_heads, kv_dtype) for layout in layouts)
            modules.append(KernelModule("prefill", head_dim, dtype))
            if cuda_core:
                modules.append(KernelModule("decode", head_dim, dtype))
    kinds = (FUSED_OPS if fused_ops else ()) + (("sampling",) if sampling else ())
    return modules + [KernelModule(kind) for kind in kinds]


@dataclasses.dataclass
class BuildResult:
    names: dict[str, str]  # label -> the module's name (its library is <name>.so)
    prebuilt: list[str]  # found in the AOT directory: not built
    seconds: float
    libraries: dict[str, Path]  # name -> the .so to load (AOT or freshly built)


def build_modules(modules: list[KernelModule], jit: Any | None = None, verbose: bool = False) -> BuildResult:
    """Build the modules not yet prebuilt, in one parallel ninja run (MAX_JOBS jobs; FlashInfer
    defaults to the core count), install them in the AOT directory, and return where each
    module's library is."""
    if jit is None:
        jit = importlib.import_module("flashinfer.jit")  # CUDA machines only
    specs = [m.spec(jit) for m in modules]
    prebuilt = [s.name for s in specs if s.is_aot]
    start = time.perf_counter()
    jit.build_jit_specs(specs, verbose=verbose, skip_prebuilt=True)
    for spec in specs:
        if spec.name not in prebuilt and spec.jit_library_path.exists():
            install_built(spec)
    seconds = time.perf_counter() - start
    libraries = {s.name: Path(s.get_library_path()) for s in specs}
    return BuildResult({m.label: s.name for m, s in zip(modules, specs, strict=True)}, prebuilt, seconds, libraries)


def install_built(spec: Any) -> None:
    """Copy a library `build_jit_specs` built into the AOT directory, where calls load it from."""
    spec.aot_path.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy2(spec.jit_library_path, spec.aot_path)


def pack_libraries(libraries: dict[str, Path], archive: Path) -> int:
    """Write the libraries (module name -> .so) into the xz tar `archive` as FlashInfer's AOT
    directory lays them out (`<name>/<name>.so`, jit/core.py's aot_path); returns its size."""
    with tarfile.open(archive, "w:xz", preset=4) as tar:
        for name, library in libraries.items():
            tar.add(library, arcname=f"{name}/{name}.so")
    return archive.stat().st_size


def unpack_libraries(archive: Path, aot_dir: Path) -> list[str]:
    """Unpack an archive of pack_libraries into FlashInfer's AOT directory, where its loader finds
    the libraries instead of building them; returns the module names. Refuses any other layout."""
    names = []
    with tarfile.open(archive, "r:xz") as tar:
        members = tar.getmembers()
        for member in members:
            name, _, file = member.name.partition("/")
            if not (member.isfile() and file == f"{name}.so" and name and ".." not in name):
                raise ValueError(f"{archive}: unexpected member {member.name!r}")
            names.append(name)
        aot_dir.mkdir(parents=True, exist_ok=True)
        tar.extractall(aot_dir, members=members, filter="data")
    return names
