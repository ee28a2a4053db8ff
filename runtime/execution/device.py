"""The one place that chooses the device, the dtype, weight prepacking and the attention backend.

Everything else receives a `torch.device`, a `torch.dtype` and a backend name from here.

On CPU the fastest dtype depends on the CPU: where bf16 matmuls are native (AVX-512 BF16 or AMX)
bf16 halves the bytes every step reads and oneDNN packs bf16 weights; on an AVX2-only CPU bf16
is emulated (prefill about 7x, batch-32 decode about 3x slower than fp32) and oneDNN cannot pack
it, so fp32 is the fast dtype there. `cpu_capability()` reads what this CPU and this torch build
can do, once; `RADIXSERVE_CPU_CAPABILITY` overrides the reading (tests run the other CPU's branch).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from runtime.contracts import env
from runtime.contracts.errors import InvalidRequest

if TYPE_CHECKING:
    from runtime.contracts.config import ServerConfig

DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
}

# The CPU features (as torch.cpu.get_capabilities() names them, read by cpuid) that decide the
# dtype and the kernels.
BF16_FLAGS = ("avx512_bf16", "amx_bf16")
FP16_FLAGS = ("avx512_fp16", "amx_fp16")
AVX512_VNNI_FLAGS = frozenset({"avx512_f", "avx512_bw", "avx512_vl", "avx512_dq", "avx512_cd", "avx512_vnni"})
REPORTED_FLAGS = ("avx2", "fma3", "f16c", *sorted(AVX512_VNNI_FLAGS), *BF16_FLAGS, *FP16_FLAGS, "amx_tile",
                  "amx_int8")

# RADIXSERVE_CPU_CAPABILITY values: what each claims the CPU has.
_AVX2 = frozenset({"avx2", "fma3", "f16c"})
OVERRIDES: dict[str, tuple[str, frozenset[str]]] = {
    "avx2": ("avx2", _AVX2),
    "avx512": ("avx512", _AVX2 | AVX512_VNNI_FLAGS),
    "avx512_bf16": ("avx512", _AVX2 | AVX512_VNNI_FLAGS | {"avx512_bf16"}),
    "amx": ("avx512", _AVX2 | AVX512_VNNI_FLAGS | {"avx512_bf16", "amx_bf16", "amx_tile", "amx_int8"}),
}

# oneDNN ISA caps (ONEDNN_MAX_CPU_ISA) below which bf16 (fp16) is not native. Unset or ALL: no cap.
_ONEDNN_NO_BF16 = {"SSE41", "AVX", "AVX2", "AVX2_VNNI", "AVX2_VNNI_2", "AVX512_CORE", "AVX512_CORE_VNNI"}
_ONEDNN_NO_FP16 = _ONEDNN_NO_BF16 | {"AVX512_CORE_BF16"}


@dataclass(frozen=True)
class CpuCapability:
    """What this CPU computes natively, as far as our choices are concerned."""

    isa: str  # the vector ISA torch dispatches to: "avx512", "avx2" or "default"
    flags: frozenset[str]  # the REPORTED_FLAGS this CPU has (cpuid)
    source: str  # "detected" or "RADIXSERVE_CPU_CAPABILITY=<value>"
    onednn_cap: str | None = None  # ONEDNN_MAX_CPU_ISA when set

    @property
    def native_bf16(self) -> bool:
        """bf16 matmuls run on bf16 hardware (and oneDNN may use it)."""
        if self.onednn_cap is not None and self.onednn_cap.upper() in _ONEDNN_NO_BF16:
            return False
        return self.isa == "avx512" and any(f in self.flags for f in BF16_FLAGS)

    @property
    def native_fp16(self) -> bool:
        if self.onednn_cap is not None and self.onednn_cap.upper() in _ONEDNN_NO_FP16:
            return False
        return self.isa == "avx512" and any(f in self.flags for f in FP16_FLAGS)

    @property
    def block_kernel_isa(self) -> str:
        """The variant of our quantized-block kernels to run (kernels/csrc/quant_gemm.cpp): its
        AVX-512 one is compiled for x86-64-v4 with VNNI (kernels/cpu_ext.py SOURCES), so it needs
        all of AVX512_VNNI_FLAGS, and torch dispatching to AVX-512 (ATEN_CPU_CAPABILITY=avx2
        turns it off too)."""
        return "avx512" if self.isa == "avx512" and self.flags >= AVX512_VNNI_FLAGS else "avx2"

    def describe(self) -> str:
        """One line for logs: 'avx512 (avx2 ... avx512_bf16; detected)'."""
        shown = " ".join(f for f in REPORTED_FLAGS if f in self.flags) or "no vector flags"
        cap = f", ONEDNN_MAX_CPU_ISA={self.onednn_cap}" if self.onednn_cap else ""
        return f"{self.isa} ({shown}; {self.source}{cap})"


def reported_flags(capabilities: Mapping[str, object]) -> frozenset[str]:
    """The REPORTED_FLAGS set in a torch.cpu.get_capabilities() mapping."""
    return frozenset(f for f in REPORTED_FLAGS if capabilities.get(f) is True)


def detect_cpu_capability(torch_isa: str, flags: frozenset[str], override: str, onednn_cap: str | None
                          ) -> CpuCapability:
    """The capability from its raw readings (pure, so every branch is testable anywhere).

    Args:
        torch_isa: `torch.backends.cpu.get_cpu_capability()` ("AVX512", "AVX2", "DEFAULT", ...;
            it honours ATEN_CPU_CAPABILITY).
        flags: the REPORTED_FLAGS the CPU reports through cpuid (`reported_flags`). Not
            /proc/cpuinfo: under qemu-user it shows the host's flags, not the emulated CPU's.
        override: RADIXSERVE_CPU_CAPABILITY ("" or "auto": none).
        onednn_cap: ONEDNN_MAX_CPU_ISA, or None.
    """
    override = override.strip().lower()
    if override and override != "auto":
        if override not in OVERRIDES:
            choices = ", ".join(OVERRIDES)
            raise ValueError(f"{env.PREFIX}CPU_CAPABILITY must be one of auto, {choices}; got {override!r}")
        isa, claimed = OVERRIDES[override]
        return CpuCapability(isa, claimed, f"{env.PREFIX}CPU_CAPABILITY={override}", onednn_cap)
    lowered = torch_isa.lower()
    isa = "avx512" if lowered.startswith("avx512") else "avx2" if lowered.startswith("avx2") else "default"
    # NOTE: flags are kept as read even when torch dispatches below AVX-512 (ATEN_CPU_CAPABILITY):
    # the native_* properties require the avx512 ISA as well.
    return CpuCapability(isa, flags, "detected", onednn_cap)


@functools.cache
def cpu_capability() -> CpuCapability:
    """This process's CPU capability, read once."""
    return detect_cpu_capability(
        torch.backends.cpu.get_cpu_capability(),
        reported_flags(torch.cpu.get_capabilities()),
        env.get_str("CPU_CAPABILITY", ""),
        os.environ.get("ONEDNN_MAX_CPU_ISA") or None,
    )


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def rank_device(device_type: str, rank: int) -> torch.device:
    """The device tensor-parallel rank `rank` computes on: its own GPU, or the CPU."""
    if device_type == "cuda":
        torch.cuda.set_device(rank)
        return torch.device("cuda", rank)
    return torch.device(device_type)


def threads_per_rank(config: ServerConfig) -> int | None:
    """Torch threads for one scheduler process: --num-threads, or with tp_size > 1 on CPU the
    cores shared out among the ranks (each would otherwise start one thread per core, and the
    ranks would fight over the cores); None leaves torch's default (all cores)."""
    if config.num_threads:
        return config.num_threads
    if config.tp_size > 1 and config.device == "cpu":
        return max(1, (os.cpu_count() or 1) // config.tp_size)
    return None


def prepare_torch(config: ServerConfig) -> None:
    """This process's torch before it builds a model: the config's random seed, and its threads
    (`threads_per_rank`)."""
    torch.manual_seed(config.random_seed)
    threads = threads_per_rank(config)
    if threads:
        torch.set_num_threads(threads)


def resolve_dtype(
    name: str, checkpoint_dtype: str | None, device: torch.device, cpu: CpuCapability | None = None
) -> tuple[torch.dtype, str]:
    """(dtype, why) for `--dtype name`.

    `auto` on CUDA keeps the checkpoint's dtype, but fp32 runs in bf16. On CPU it picks the
    fastest dtype the CPU computes natively, whatever the checkpoint holds: bf16 where bf16 is
    native, fp32 otherwise (as vLLM's and SGLang's `auto`, checkpoints in fp32 run in a 16-bit
    dtype where that is fast).
    """
    if name != "auto":
        return DTYPES[name], "as asked"
    if device.type == "cuda":
        dtype = DTYPES.get(checkpoint_dtype or "", torch.bfloat16)
        if dtype == torch.float32:
            return torch.bfloat16, "auto: fp32 checkpoint runs in bf16 on CUDA"
        return dtype, f"auto: the checkpoint's dtype ({checkpoint_dtype or 'unknown, so bf16'})"
    cpu = cpu or cpu_capability()
    if cpu.native_bf16:
        return torch.bfloat16, f"auto: this CPU computes bf16 natively: {cpu.describe()}"
    why = "auto: this CPU has no native bf16 (bf16 would be emulated, several times slower)"
    return torch.float32, f"{why}: {cpu.describe()}"


def should_prepack(device: torch.device, dtype: torch.dtype, cpu: CpuCapability | None = None) -> bool:
    """Whether linear weights are prepacked with oneDNN (CPU only).

    fp32 always packs. A 16-bit dtype packs only where the CPU computes it natively: elsewhere
    oneDNN cannot pack it (or packs something that disagrees), and the plain path is used.
    """
    if device.type != "cpu":
        return False
    if dtype == torch.float32:
        return True
    cpu = cpu or cpu_capability()
    if dtype == torch.bfloat16:
        return cpu.native_bf16
    return dtype == torch.float16 and cpu.native_fp16


def choose_attention_backend(
    name: str, device_type: str, dtype: str, kv_dtype: str, flashinfer_importable: bool, jit_problem: str | None
) -> tuple[str, str]:
    """(backend, why) for `--attention-backend name` (pure: every probe is an argument).

    `auto` picks FlashInfer on CUDA when it imports, has kernels for the dtypes and can build or
    find its kernels; otherwise the torch backend, and `why` says what was missing. An explicit
    `flashinfer` that cannot run is an error naming what to change.
    """
    from kernels.flashinfer_support import unsupported_dtype

    if name == "torch" or (name == "auto" and device_type != "cuda"):
        return "torch", "as asked" if name == "torch" else "not on CUDA"
    if device_type != "cuda":
        raise InvalidRequest("--attention-backend flashinfer needs a CUDA device", param="attention_backend")
    problem = None if flashinfer_importable else (
        "flashinfer is not installed: `pip install -e '.[gpu]'` (see scripts/setup.sh)")
    problem = problem or unsupported_dtype(dtype, kv_dtype) or jit_problem
    if problem is None:
        return "flashinfer", "auto: CUDA with flashinfer" if name == "auto" else "as asked"
    if name == "flashinfer":
        raise InvalidRequest(problem, param="attention_backend")
    return "torch", f"auto: the torch backend, because {problem}"


def resolve_attention_backend(name: str, device: torch.device, dtype: str, kv_dtype: str) -> tuple[str, str]:
    """`choose_attention_backend` with this machine's probes (flashinfer imported only on CUDA)."""
    if name == "torch" or device.type != "cuda":
        return choose_attention_backend(name, device.type, dtype, kv_dtype, False, None)
    from kernels.flashinfer_support import find_nvcc, has_prebuilt_kernels, import_flashinfer, jit_problem

    try:
        import_flashinfer()
        importable = True
    except ImportError:
        importable = False
    problem = jit_problem(find_nvcc(), has_prebuilt_kernels())
    return choose_attention_backend(name, device.type, dtype, kv_dtype, importable, problem)


def dtype_name(dtype: torch.dtype) -> str:
    return {v: k for k, v in DTYPES.items()}[dtype]
