"""Our C++ CPU kernels: built by setup for this machine, loaded without a compiler, switchable."""

from __future__ import annotations

from pathlib import Path

import pytest

from kernels import cpu_ext
from runtime.execution import cpu_kernels


def test_setup_built_the_kernels_for_this_machine() -> None:
    cpu_kernels.load_cpu_kernels.cache_clear()
    module = cpu_kernels.load_cpu_kernels()
    assert module is not None, "make setup builds them: python -m runtime.execution.cpu_kernels build"
    assert hasattr(module, "decode_attention")
    assert Path(module.__file__).parent == cpu_kernels.kernels_dir()


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


def test_build_key_follows_sources_and_cpu(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    assert cpu_ext.build_key("avx2") != cpu_ext.build_key("avx2 avx512f")
    source = tmp_path / "k.cpp"
    source.write_text("// one")
    monkeypatch.setattr(cpu_ext, "SOURCES", [source])
    first = cpu_ext.build_key("avx2")
    source.write_text("// two")
    assert cpu_ext.build_key("avx2") != first
