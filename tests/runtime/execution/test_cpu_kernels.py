"""Our C++ CPU kernels: built by setup for this machine, loaded without a compiler, switchable,
refused on a CPU that lacks what their build needs, and each ISA variant holding only its own
instructions (also run under qemu's AVX2-only EPYC-Rome by scripts/test_avx2.sh)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from kernels import cpu_ext
from runtime.execution import cpu_kernels

# Operands only AVX-512 (EVEX) code has: zmm, the upper 16 xmm/ymm registers, mask registers.
AVX512_OPERAND = re.compile(r"%zmm|%[xy]mm(1[6-9]|2\d|3[01])\b|%k[0-7]\b")


@pytest.fixture(scope="module")
def module():
    cpu_kernels.load_cpu_kernels.cache_clear()
    built = cpu_kernels.load_cpu_kernels()
    assert built is not None, "make setup builds them: python -m runtime.execution.cpu_kernels build"
    return built


def test_setup_built_the_kernels_for_this_machine(module) -> None:
    assert hasattr(module, "decode_attention")
    folder = Path(module.__file__).parent
    assert folder == cpu_kernels.kernels_dir()
    assert cpu_ext.manifest(folder)["march"] == cpu_kernels.kernels_march()
    assert cpu_ext.missing_features(folder) == []


def test_off_switch_and_missing_build_fall_back(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    try:
        monkeypatch.setenv("RADIXSERVE_CPU_KERNELS", "0")
        cpu_kernels.load_cpu_kernels.cache_clear()
        assert cpu_kernels.load_cpu_kernels() is None
        monkeypatch.delenv("RADIXSERVE_CPU_KERNELS")
        monkeypatch.setenv("RADIXSERVE_CACHE_DIR", str(tmp_path))  # nothing built there: no compile
        cpu_kernels.load_cpu_kernels.cache_clear()
        assert cpu_kernels.load_cpu_kernels() is None
        assert not any(tmp_path.iterdir())
    finally:
        cpu_kernels.load_cpu_kernels.cache_clear()


def test_a_build_needing_what_this_cpu_lacks_is_refused_by_name(tmp_path: Path) -> None:
    lacking = "amx_fp16" if "amx_fp16" not in cpu_ext.cpu_features() else "a_feature_no_cpu_has"
    (tmp_path / cpu_ext.MANIFEST).write_text(json.dumps({"march": "native", "requires": ["avx2", lacking]}))
    module = tmp_path / f"{cpu_ext.NAME}.so"
    module.write_bytes(b"never opened")
    with pytest.raises(cpu_ext.IncompatibleBuild, match=f"-march=native and need {lacking}, which this CPU"):
        cpu_ext.import_built(module)
    assert cpu_ext.missing_features(tmp_path, have=frozenset({"avx2", lacking})) == []


def test_build_key_follows_sources_cpu_and_march() -> None:
    assert cpu_ext.build_key("avx2") != cpu_ext.build_key("avx2 avx512_f")
    assert cpu_ext.build_key("", "native") != cpu_ext.build_key("", "x86-64-v3")


def test_variants_take_only_their_own_flags() -> None:
    for march in cpu_ext.MARCHES:
        avx2 = cpu_ext.source_flags("quant_gemm_avx2.cpp", march)
        assert "-march=x86-64-v3" in avx2 and not any("native" in f and "march" in f for f in avx2)
        assert f"-march={march}" in cpu_ext.source_flags("quant_gemm.cpp", march)
    needed = cpu_ext.required_features(cpu_ext.SOURCES["quant_gemm_avx2.cpp"] or ())
    assert {"avx2", "fma3", "f16c"} <= needed and not any(f.startswith("avx512") for f in needed)


def test_only_the_avx512_variant_holds_avx512_code(module) -> None:
    """The AVX2 variant never, and in an x86-64-v3 build nothing but the AVX-512 variant."""
    if shutil.which("objdump") is None:
        pytest.skip("objdump (binutils) is not installed")
    functions = _functions_with_avx512_operands(Path(module.__file__))
    assert not [f for f in functions if "quant::avx2::" in f], "the AVX2 variant holds AVX-512 code"
    if cpu_ext.manifest(Path(module.__file__).parent)["march"] == "x86-64-v3":
        leaks = [f for f in functions if "quant::avx512::" not in f]
        assert not leaks, f"the x86-64-v3 build holds AVX-512 code outside the AVX-512 variant: {leaks[:5]}"


def _functions_with_avx512_operands(path: Path) -> set[str]:
    """The (demangled) names of the functions whose code has an AVX-512-only operand."""
    listing = subprocess.run(["objdump", "-d", "-C", "--no-show-raw-insn", str(path)], capture_output=True,
                             text=True, check=True).stdout
    names, current = set(), ""
    for line in listing.splitlines():
        header = re.match(r"^[0-9a-f]+ <(.*)>:$", line)
        if header:
            current = header.group(1)
        elif AVX512_OPERAND.search(line):
            names.add(current)
    return names
