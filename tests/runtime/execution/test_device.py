"""CPU capability reading and the dtype `auto` picks.

The decision functions are pure over their readings, so every CPU's branch is checked here on
any CPU. What depends on the real hardware is asserted for the CPU the test runs on; an AVX2-only
CPU runs for real under qemu (scripts/test_avx2.sh, which `make test` runs after pytest).
"""

from __future__ import annotations

import os

import pytest
import torch

from runtime.execution.device import (
    CpuCapability,
    cpu_capability,
    detect_cpu_capability,
    reported_flags,
    resolve_dtype,
    should_prepack,
)

CPU, CUDA = torch.device("cpu"), torch.device("cuda")
# What torch.cpu.get_capabilities() reports (cpuid) on each kind of CPU, as far as REPORTED_FLAGS go.
AVX2 = {"avx2": True, "fma3": True, "f16c": True}
AVX512 = {**AVX2, **dict.fromkeys(["avx512_f", "avx512_bw", "avx512_vl", "avx512_dq", "avx512_cd", "avx512_vnni"],
                                  True)}
ZEN3_FLAGS = reported_flags({**AVX2, "avx512_f": False, "sha": True})
ZEN4_FLAGS = reported_flags({**AVX512, "avx512_bf16": True})
SPR_FLAGS = reported_flags({**AVX512, "avx512_bf16": True, "avx512_fp16": True, "amx_bf16": True, "amx_tile": True,
                            "amx_int8": True})


def cap(torch_isa: str, flags: frozenset[str], override: str = "", onednn: str | None = None) -> CpuCapability:
    return detect_cpu_capability(torch_isa, flags, override, onednn)


# ---- pure decisions, every CPU's branch -------------------------------------------------------

def test_only_set_reported_flags_are_read():
    assert {"avx2", "fma3", "f16c"} == ZEN3_FLAGS
    assert reported_flags({"architecture": "x86_64", "l2_cache_size": 1048576, "avx2": False}) == frozenset()


def test_the_vnni_variant_needs_every_flag_of_its_build():
    assert cap("AVX512", ZEN4_FLAGS).block_kernel_isa == "avx512"
    assert cap("AVX512", ZEN4_FLAGS - {"avx512_vl"}).block_kernel_isa == "avx2"
    assert cap("AVX2", ZEN4_FLAGS).block_kernel_isa == "avx2"  # ATEN_CPU_CAPABILITY=avx2


@pytest.mark.parametrize("torch_isa,flags,onednn,native", [
    ("AVX2", ZEN3_FLAGS, None, False),  # AMD Zen 3: AVX2 only
    ("AVX512", ZEN4_FLAGS, None, True),  # AVX-512 with bf16
    ("AVX512", SPR_FLAGS, None, True),  # AMX
    ("AVX512", reported_flags(AVX512), None, False),  # AVX-512 without bf16
    ("AVX2", ZEN4_FLAGS, None, False),  # torch limited by ATEN_CPU_CAPABILITY=avx2
    ("AVX512", ZEN4_FLAGS, "AVX2", False),  # oneDNN limited by ONEDNN_MAX_CPU_ISA
    ("AVX512", ZEN4_FLAGS, "AVX512_CORE_BF16", True),
    ("DEFAULT", frozenset(), None, False),  # no vector ISA at all
])
def test_native_bf16(torch_isa, flags, onednn, native):
    c = cap(torch_isa, flags, onednn=onednn)
    assert c.native_bf16 is native
    assert c.source == "detected"
    dtype, why = resolve_dtype("auto", "bfloat16", CPU, c)
    assert dtype == (torch.bfloat16 if native else torch.float32)
    assert c.describe() in why  # the startup line names the CPU behind the choice
    assert should_prepack(CPU, torch.bfloat16, c) is native
    assert should_prepack(CPU, torch.float32, c)


def test_fp16_is_native_only_with_fp16_hardware():
    assert cap("AVX512", SPR_FLAGS).native_fp16
    assert not cap("AVX512", ZEN4_FLAGS).native_fp16
    assert not should_prepack(CPU, torch.float16, cap("AVX512", ZEN4_FLAGS))


@pytest.mark.parametrize("override,native", [
    ("avx2", False), ("avx512", False), ("avx512_bf16", True), ("amx", True), ("AVX2", False),
])
def test_override_replaces_the_reading(override, native):
    c = cap("AVX512", ZEN4_FLAGS, override=override)
    assert c.native_bf16 is native
    assert c.source == f"RADIXSERVE_CPU_CAPABILITY={override.lower()}"
    assert cap("AVX2", ZEN3_FLAGS, override="auto").source == "detected"


def test_bad_override_names_the_variable():
    with pytest.raises(ValueError, match="RADIXSERVE_CPU_CAPABILITY must be one of auto, avx2"):
        cap("AVX2", ZEN3_FLAGS, override="sse")


def test_auto_dtype_on_cpu_ignores_the_checkpoint_dtype():
    for checkpoint in ("float32", "bfloat16", "float16", None):
        assert resolve_dtype("auto", checkpoint, CPU, cap("AVX2", ZEN3_FLAGS))[0] == torch.float32
        assert resolve_dtype("auto", checkpoint, CPU, cap("AVX512", ZEN4_FLAGS))[0] == torch.bfloat16


def test_explicit_dtype_and_cuda_auto():
    zen3 = cap("AVX2", ZEN3_FLAGS)
    assert resolve_dtype("bfloat16", "float32", CPU, zen3) == (torch.bfloat16, "as asked")
    assert resolve_dtype("auto", "float32", CUDA, zen3)[0] == torch.bfloat16
    assert resolve_dtype("auto", "float16", CUDA, zen3)[0] == torch.float16
    assert not should_prepack(CUDA, torch.float32, zen3)


# ---- this CPU --------------------------------------------------------------------------------

def test_this_cpu_reading_matches_cpuid():
    c = cpu_capability()
    override = os.environ.get("RADIXSERVE_CPU_CAPABILITY", "auto").lower()
    if override not in ("", "auto"):
        assert c.source == f"RADIXSERVE_CPU_CAPABILITY={override}"
        return
    has_bf16 = bool({"avx512_bf16", "amx_bf16"} & reported_flags(torch.cpu.get_capabilities()))
    limited = os.environ.get("ATEN_CPU_CAPABILITY", "").lower() == "avx2" or (
        os.environ.get("ONEDNN_MAX_CPU_ISA", "").upper() == "AVX2"
    )
    assert c.native_bf16 is (has_bf16 and not limited), c.describe()


def test_resolved_default_config_uses_the_native_dtype(default_model_path):
    """The default model (a bf16 checkpoint) served with `--dtype auto` on this CPU."""
    from runtime.contracts.config import ServerConfig
    from runtime.execution.resolve import resolve_config

    resolved = resolve_config(ServerConfig(model_path=default_model_path, device="cpu"))
    want = "bfloat16" if cpu_capability().native_bf16 else "float32"
    assert (resolved.dtype, resolved.kv_cache_dtype) == (want, want)


def test_threads_are_shared_out_among_cpu_ranks() -> None:
    from runtime.contracts.config import ServerConfig
    from runtime.execution.device import threads_per_rank

    cores = os.cpu_count() or 1
    assert threads_per_rank(ServerConfig(device="cpu")) is None  # torch's default: every core
    assert threads_per_rank(ServerConfig(device="cpu", tp_size=2)) == max(1, cores // 2)
    assert threads_per_rank(ServerConfig(device="cpu", tp_size=2, num_threads=3)) == 3
    assert threads_per_rank(ServerConfig(device="cuda", tp_size=2)) is None


def test_resolve_refuses_a_split_the_model_cannot_take(default_model_path: str) -> None:
    from runtime.contracts.config import ServerConfig
    from runtime.contracts.errors import InvalidRequest
    from runtime.execution.resolve import resolve_config

    with pytest.raises(InvalidRequest) as err:  # the default model has 9 attention heads
        resolve_config(ServerConfig(model_path=default_model_path, device="cpu", tp_size=16))
    assert err.value.param == "tp_size" and "9 attention heads" in str(err.value)
