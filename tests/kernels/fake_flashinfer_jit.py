"""A stand-in for `flashinfer.jit` on CPU: the two attention module generators with the real
positional signatures (jit/attention/modules.py in 0.6.18.post1), module names in the real URI
format, and `build_jit_specs` "building" a small file per module into a JIT directory, so the
GPU check's compile stage and its archive of the built libraries run here end to end.

`install_module(root)` puts it under `flashinfer.jit` (after tests/kernels/fake_flashinfer's
install_module); `BUILT` lists the names each build call built.
"""

from __future__ import annotations

import sys
import types
from dataclasses import dataclass
from pathlib import Path

import torch

DTYPE_NAMES = {torch.float16: "f16", torch.bfloat16: "bf16", torch.int32: "i32"}  # filename_safe_dtype_map
BUILT: list[list[str]] = []


class env:  # noqa: N801 - stands for the module flashinfer.jit.env
    FLASHINFER_JIT_DIR = Path("/nonexistent")
    FLASHINFER_AOT_DIR = Path("/nonexistent")


@dataclass
class JitSpec:
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
        if skip_prebuilt and spec.is_aot:
            continue
        spec.jit_library_path.parent.mkdir(parents=True, exist_ok=True)
        spec.jit_library_path.write_bytes(spec.name.encode() * 64)  # a few KB, compressible like a library
        built.append(spec.name)
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


def install_module(root: Path) -> types.ModuleType:
    """Register the stand-in as `flashinfer.jit` (and its submodules norm, rope, sampling, activation), with
    its JIT and AOT directories under `root`."""
    env.FLASHINFER_JIT_DIR = root / "cached_ops"
    env.FLASHINFER_AOT_DIR = root / "aot"
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
    parent = sys.modules.get("flashinfer")
    if parent is not None:
        parent.jit = module  # type: ignore[attr-defined]
    return module
