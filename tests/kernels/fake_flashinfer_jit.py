"""A stand-in for `flashinfer.jit` on CPU: FlashInfer 0.6.18.post1's module generators with the
real positional signatures (jit/attention/modules.py), module names in the real URI format, and
its two ways to a kernel library (jit/core.py), so the GPU check's stages run here end to end:

- `build_jit_specs`, the ahead-of-time entry point, runs one ninja build from the shared
  `cached_ops/` folder: each library lands in `cached_ops/<name>/`, ninja's log of it in
  `cached_ops/` itself (the stand-in writes a small file per module, and the log).
- A call that needs a module (a wrapper's plan(), a fused op) goes through its `get_*_module`
  (LOADERS, named where FlashInfer defines them) and `JitSpec.build_and_load()`: `try_load()`
  accepts only a library in the AOT directory; anything else goes to `build()`, which runs ninja
  from `cached_ops/<name>/`. No log is there, so ninja recompiles every object: minutes of nvcc
  inside a stage bounded to seconds. The stand-in raises LateCompile instead, so a CPU run fails
  where the GPU run would time out.

`install_module(root)` puts it under `flashinfer.jit` (after tests/kernels/fake_flashinfer's
install_module); `BUILT` lists the names each build call built, `LOADED` what calls loaded.
"""

from __future__ import annotations

import sys
import types
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

DTYPE_NAMES = {torch.float16: "f16", torch.bfloat16: "bf16", torch.int32: "i32"}  # filename_safe_dtype_map
BUILT: list[list[str]] = []
LOADED: list[str] = []  # module names, in the order calls first loaded them (this process)
NINJA_LOG = ".ninja_log"
_CACHE: dict[str, LoadedModule] = {}  # the get_*_module functions are functools.cache'd
_INSTALLED: list[types.ModuleType] = []


class LateCompile(RuntimeError):
    """A call would make FlashInfer compile a kernel module (what the compile stage is for)."""


@dataclass(frozen=True)
class LoadedModule:
    name: str
    path: Path


class env:  # noqa: N801 - stands for the module flashinfer.jit.env
    FLASHINFER_JIT_DIR = Path("/nonexistent")
    FLASHINFER_AOT_DIR = Path("/nonexistent")


@dataclass
class JitSpec:
    """jit/core.py JitSpecNvcc, the spec every generator here returns."""

    name: str

    @property
    def aot_path(self) -> Path:
        return env.FLASHINFER_AOT_DIR / self.name / f"{self.name}.so"

    @property
    def jit_library_path(self) -> Path:
        return env.FLASHINFER_JIT_DIR / self.name / f"{self.name}.so"

    @property
    def is_aot(self) -> bool:
        return self.aot_path.exists()

    def get_library_path(self) -> Path:
        return self.aot_path if self.is_aot else self.jit_library_path

    def try_load(self) -> LoadedModule | None:
        """Only the AOT library is taken as valid without running ninja."""
        return self.load(self.aot_path) if self.is_aot else None

    def build(self, verbose: bool | None = None, need_lock: bool = False) -> None:
        """ninja from cached_ops/<name>/: what would be compiled there, raised as LateCompile."""
        folder = self.jit_library_path.parent
        if not self.jit_library_path.exists():
            raise LateCompile(f"{self.name}: never built, so this call compiles it (nvcc, minutes)")
        if not (folder / NINJA_LOG).exists():
            raise LateCompile(
                f"{self.name}: built by build_jit_specs but not in the AOT directory "
                f"{env.FLASHINFER_AOT_DIR}; build_and_load() runs ninja in {folder}, which holds no ninja "
                "log, so nvcc recompiles every object of it (minutes)")

    def load(self, so_path: Path | None = None) -> LoadedModule:
        path = so_path or self.jit_library_path
        if self.name not in LOADED:
            LOADED.append(self.name)
        return LoadedModule(self.name, path)

    def build_and_load(self) -> LoadedModule:
        cached = self.try_load()
        if cached is not None:
            return cached
        self.build()
        return self.load()


def _dtype(t: torch.dtype, what: str) -> str:
    if t not in DTYPE_NAMES:
        raise KeyError(f"{what} {t} has no kernels")  # the real map raises KeyError too
    return DTYPE_NAMES[t]


def _uri(prefix: str, dq: torch.dtype, dkv: torch.dtype, do: torch.dtype, di: torch.dtype, hqk: int, hvo: int,
         pos: int, swa: bool, cap: bool) -> str:
    return (f"{prefix}_with_kv_cache_dtype_q_{_dtype(dq, 'q')}_dtype_kv_{_dtype(dkv, 'kv')}_dtype_o_{_dtype(do, 'o')}_"
            f"dtype_idx_{_dtype(di, 'idx')}_head_dim_qk_{hqk}_head_dim_vo_{hvo}_posenc_{pos}_use_swa_{swa}_"
            f"use_logits_cap_{cap}")


def gen_batch_prefill_module(backend: str, dtype_q: torch.dtype, dtype_kv: torch.dtype, dtype_o: torch.dtype,
                             dtype_idx: torch.dtype, head_dim_qk: int, head_dim_vo: int, pos_encoding_mode: int,
                             use_sliding_window: bool, use_logits_soft_cap: bool, use_fp16_qk_reduction: bool
                             ) -> JitSpec:
    if backend not in ("fa2", "fa3"):
        raise ValueError(f"backend {backend!r}")
    uri = _uri("batch_prefill", dtype_q, dtype_kv, dtype_o, dtype_idx, head_dim_qk, head_dim_vo, pos_encoding_mode,
               use_sliding_window, use_logits_soft_cap)
    return JitSpec(f"{uri}_f16qk_{use_fp16_qk_reduction}" + ("_sm90" if backend == "fa3" else ""))


def gen_batch_decode_module(dtype_q: torch.dtype, dtype_kv: torch.dtype, dtype_o: torch.dtype,
                            dtype_idx: torch.dtype, head_dim_qk: int, head_dim_vo: int, pos_encoding_mode: int,
                            use_sliding_window: bool, use_logits_soft_cap: bool) -> JitSpec:
    return JitSpec(_uri("batch_decode", dtype_q, dtype_kv, dtype_o, dtype_idx, head_dim_qk, head_dim_vo,
                        pos_encoding_mode, use_sliding_window, use_logits_soft_cap))


def build_jit_specs(specs: list[JitSpec], verbose: bool = False, skip_prebuilt: bool = True) -> None:
    built = []
    for spec in specs:
        if skip_prebuilt and spec.aot_path.exists():
            continue
        spec.jit_library_path.parent.mkdir(parents=True, exist_ok=True)
        spec.jit_library_path.write_bytes(spec.name.encode() * 64)  # a few KB, compressible like a library
        built.append(spec.name)
    if built:  # ninja ran in cached_ops/: its log is there, not in the modules' own folders
        with (env.FLASHINFER_JIT_DIR / NINJA_LOG).open("a") as log:
            log.writelines(f"{name}/{name}.so\n" for name in built)
    BUILT.append(built)


def gen_norm_module() -> JitSpec:  # flashinfer.jit.norm
    return JitSpec("norm")


def gen_rope_module() -> JitSpec:  # flashinfer.jit.rope
    return JitSpec("rope")


def gen_sampling_module() -> JitSpec:  # flashinfer.jit.sampling
    return JitSpec("sampling")


def gen_act_and_mul_module(act_func_name: str) -> JitSpec:  # flashinfer.jit.activation
    if act_func_name not in ("silu", "gelu", "gelu_tanh"):
        raise KeyError(act_func_name)
    return JitSpec(f"{act_func_name}_and_mul")


def _cached(spec: JitSpec) -> LoadedModule:
    if spec.name not in _CACHE:
        _CACHE[spec.name] = spec.build_and_load()
    return _CACHE[spec.name]


def get_batch_prefill_module(backend: str, *args: Any) -> LoadedModule:
    return _cached(gen_batch_prefill_module(backend, *args))


def get_batch_decode_module(*args: Any) -> LoadedModule:
    return _cached(gen_batch_decode_module(*args))


def get_norm_module() -> LoadedModule:
    return _cached(gen_norm_module())


def get_rope_module() -> LoadedModule:
    return _cached(gen_rope_module())


def get_act_and_mul_module(act_func_name: str) -> LoadedModule:
    return _cached(gen_act_and_mul_module(act_func_name))


def get_sampling_module() -> LoadedModule:
    return _cached(gen_sampling_module())


# Where FlashInfer defines each loader the stand-in's calls go through.
LOADERS: dict[str, Callable[..., LoadedModule]] = {
    "flashinfer.prefill.get_batch_prefill_module": get_batch_prefill_module,
    "flashinfer.decode.get_batch_decode_module": get_batch_decode_module,
    "flashinfer.norm.get_norm_module": get_norm_module,
    "flashinfer.rope.get_rope_module": get_rope_module,
    "flashinfer.activation.get_act_and_mul_module": get_act_and_mul_module,
    "flashinfer.sampling.get_sampling_module": get_sampling_module,
}


def load_for_call(loader: str, *args: Any) -> None:
    """Load what a call of the stand-in needs, the way FlashInfer does, when this stand-in is the
    installed `flashinfer.jit` (the dry run); without it the load path is not modeled."""
    if models_loading():
        LOADERS[loader](*args)


def models_loading() -> bool:
    """Whether this stand-in is the `flashinfer.jit` now installed."""
    return bool(_INSTALLED) and sys.modules.get("flashinfer.jit") is _INSTALLED[-1]


def install_module(root: Path) -> types.ModuleType:
    """Register the stand-in as `flashinfer.jit` (and its submodules norm, rope, sampling, activation), with
    its JIT and AOT directories under `root`."""
    env.FLASHINFER_JIT_DIR = root / "cached_ops"
    env.FLASHINFER_AOT_DIR = root / "aot"
    _CACHE.clear()
    LOADED.clear()
    module = types.ModuleType("flashinfer.jit")
    for name in ("env", "JitSpec", "gen_batch_prefill_module", "gen_batch_decode_module", "build_jit_specs",
                 "gen_act_and_mul_module"):
        setattr(module, name, globals()[name])
    for sub, function in (("norm", gen_norm_module), ("rope", gen_rope_module), ("sampling", gen_sampling_module),
                          ("activation", gen_act_and_mul_module)):
        submodule = types.ModuleType(f"flashinfer.jit.{sub}")
        setattr(submodule, function.__name__, function)
        setattr(module, sub, submodule)
        sys.modules[f"flashinfer.jit.{sub}"] = submodule
    sys.modules["flashinfer.jit"] = module
    _INSTALLED[:] = [module]
    parent = sys.modules.get("flashinfer")
    if parent is not None:
        parent.jit = module  # type: ignore[attr-defined]
    return module
