"""CPU capability reading, the dtype `auto` picks, and the AVX2 branch run in emulation.

The decision functions are pure over their readings, so every CPU's branch is checked here on
any CPU. What depends on the real hardware is asserted for the CPU the test runs on, and on a CPU
with native bf16 the AVX2 branch runs as well, in a subprocess with torch and oneDNN limited to
AVX2 (`runtime.execution.device.emulation_env`), which reproduces that CPU's behaviour (oneDNN refuses
to pack bf16; bf16 matmuls are emulated).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from runtime.execution.device import (
    CpuCapability,
    cpu_capability,
    detect_cpu_capability,
    emulation_env,
    read_cpu_flags,
    resolve_dtype,
    should_prepack,
)

CPU, CUDA = torch.device("cpu"), torch.device("cuda")
ROOT = Path(__file__).resolve().parents[3]
ZEN3_FLAGS = "flags\t\t: fpu sse sse2 ssse3 sse4_1 sse4_2 avx f16c fma avx2 bmi2 sha_ni\n"
ZEN4_FLAGS = "flags\t\t: fpu sse avx avx2 avx512f avx512dq avx512bw avx512_bf16 avx512_vnni\n"
SPR_FLAGS = "flags\t\t: avx2 avx512f avx512_bf16 avx512_fp16 amx_bf16 amx_tile amx_int8\n"


def cap(torch_isa: str, cpuinfo: str, override: str = "", onednn: str | None = None) -> CpuCapability:
    return detect_cpu_capability(torch_isa, cpuinfo, override, onednn)


# ---- pure decisions, every CPU's branch -------------------------------------------------------

def test_flags_are_read_from_the_first_flags_line():
    flags = read_cpu_flags("processor: 0\n" + ZEN4_FLAGS + ZEN3_FLAGS)
    assert flags == {"avx2", "avx512f", "avx512bw", "avx512_vnni", "avx512_bf16"}
    assert read_cpu_flags("") == frozenset()


@pytest.mark.parametrize("torch_isa,cpuinfo,onednn,native", [
    ("AVX2", ZEN3_FLAGS, None, False),  # AMD Zen 3: AVX2 only
    ("AVX512", ZEN4_FLAGS, None, True),  # AVX-512 with bf16
    ("AVX512", SPR_FLAGS, None, True),  # AMX
    ("AVX512", "flags: avx2 avx512f avx512bw\n", None, False),  # AVX-512 without bf16
    ("AVX2", ZEN4_FLAGS, None, False),  # torch limited by ATEN_CPU_CAPABILITY=avx2
    ("AVX512", ZEN4_FLAGS, "AVX2", False),  # oneDNN limited by ONEDNN_MAX_CPU_ISA
    ("AVX512", ZEN4_FLAGS, "AVX512_CORE_BF16", True),
    ("DEFAULT", "", None, False),  # no vector ISA at all
])
def test_native_bf16(torch_isa, cpuinfo, onednn, native):
    c = cap(torch_isa, cpuinfo, onednn=onednn)
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


def test_only_avx2_can_be_emulated():
    assert emulation_env("avx2") == {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2",
                                     "RADIXSERVE_CPU_KERNELS_MARCH": "x86-64-v3"}
    with pytest.raises(ValueError):
        emulation_env("avx512_bf16")


# ---- this CPU --------------------------------------------------------------------------------

def test_this_cpu_reading_matches_cpuinfo():
    c = cpu_capability()
    override = os.environ.get("RADIXSERVE_CPU_CAPABILITY", "auto").lower()
    if override not in ("", "auto"):
        assert c.source == f"RADIXSERVE_CPU_CAPABILITY={override}"
        return
    text = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    has_bf16 = bool({"avx512_bf16", "amx_bf16"} & read_cpu_flags(text))
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


AVX2_TESTS = ["tests/kernels/test_linear.py", "tests/runtime/execution/test_device.py",
              "tests/kernels/test_cpu_elementwise.py", "tests/runtime/execution/test_cpu_kernels.py",
              "tests/kernels/test_prefill_attention.py"]


@pytest.mark.slow
def test_avx2_branch_runs_in_emulation():
    """On a CPU with native bf16, rerun the CPU-dependent tests as on an AVX2-only CPU.

    What this covers: torch's and oneDNN's AVX2 kernels (chosen by their own dispatch), the
    dtype and prepacking decisions, and our C++ kernels built for x86-64-v3 (AVX2, no AVX-512:
    the build is checked for zmm registers) executing for real. What it does not: code that
    torch compiled for the whole library rather than per capability, and rounding that differs
    in the CPU's own arithmetic: that is why the suite's accuracy bars carry margins meant to
    hold on both kinds of CPU rather than the values one machine measured."""
    if not cpu_capability().native_bf16:
        # This CPU *is* the AVX2 branch, which the rest of this run already tested; the native
        # branch is covered by the pure decision tests above (it cannot be emulated from here).
        assert not should_prepack(CPU, torch.bfloat16)
        return
    env = {**os.environ, **emulation_env("avx2")}
    env.pop("RADIXSERVE_CPU_CAPABILITY", None)
    # One interpreter for all of it, so torch imports once: the build command (`python -m
    # runtime.execution.cpu_kernels build`, whose last line is the module's path), the probe's line, then
    # the CPU-dependent tests in pytest.
    args = ["-q", "-p", "no:cacheprovider", *AVX2_TESTS, "-k", "not avx2_branch_runs"]
    script = ("import runpy, sys, pytest\n"
              "sys.argv = ['runtime.execution.cpu_kernels', 'build']\n"
              "runpy.run_module('runtime.execution.cpu_kernels', run_name='__main__')\n"
              "from runtime.execution.device import cpu_capability as c\n"
              "from runtime.execution.cpu_kernels import load_cpu_kernels as k\n"
              "print('probe:', c().native_bf16, c().isa, k() is not None, flush=True)\n"
              f"sys.exit(pytest.main({args!r}))\n")
    run = subprocess.run([sys.executable, "-c", script], env=env, cwd=ROOT, capture_output=True, text=True,
                         timeout=540)
    out = run.stdout.splitlines()
    probe_at = next((i for i, line in enumerate(out) if line.startswith("probe: ")), 0)
    assert probe_at > 0, run.stdout[-3000:] + run.stderr[-3000:]  # the build failed, or printed no path
    module = Path(out[probe_at - 1])
    assert module.parent.parent.name == "x86-64-v3", module
    disassembly = subprocess.run(["objdump", "-d", "-C", str(module)], capture_output=True, text=True)
    if disassembly.returncode == 0:  # binutils is there on our machines; the check is a bonus elsewhere
        # AVX-512 instructions only in the quantized kernels' AVX-512 variant, which is compiled in
        # every build (a function target) and chosen at run time only where the CPU has it.
        leaks = [name for name in _functions_using_zmm(disassembly.stdout) if "avx512::" not in name]
        assert not leaks, f"the AVX2 build holds AVX-512 code outside the avx512 variant: {leaks[:5]}"
    assert out[probe_at].split()[1:] == ["False", "avx2", "True"], out[probe_at]
    tests = "\n".join(out[probe_at + 1:])
    assert run.returncode == 0, tests[-4000:] + run.stderr[-2000:]
    assert " passed" in tests and "skipped" not in tests


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


def _functions_using_zmm(disassembly: str) -> set[str]:
    """The (demangled) names of the functions whose code uses zmm registers."""
    names, current = set(), ""
    for line in disassembly.splitlines():
        header = re.match(r"^[0-9a-f]+ <(.*)>:$", line)
        if header:
            current = header.group(1)
        elif "zmm" in line:
            names.add(current)
    return names
