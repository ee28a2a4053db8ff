"""When FlashInfer runs, and what a user is told when it cannot (pure rules, no GPU needed)."""

from __future__ import annotations

import os
import stat

import pytest

from kernels.flashinfer_support import decode_uses_tensor_cores, find_nvcc, jit_problem, unsupported_dtype
from runtime.contracts.errors import InvalidRequest
from runtime.execution.device import choose_attention_backend


@pytest.mark.parametrize("heads,kv_heads,kv_dtype,expected", [
    (9, 3, "bfloat16", False),  # SmolLM2: group 3, CUDA cores
    (32, 8, "bfloat16", True),  # Llama-3.2-1B: group 4, tensor cores as SGLang
    (32, 32, "float16", False),  # MHA
    (28, 4, "bfloat16", True),  # Qwen2.5-7B: group 7, which the CUDA-core decode lacks
    (40, 8, "bfloat16", True),  # Qwen2.5-14B / Qwen3-14B: group 5
    (64, 4, "bfloat16", True),  # group 16
    (12, 2, "float32", False),  # group 6 has a CUDA-core kernel (fp32 has none at all: refused elsewhere)
    (20, 4, "float32", True),  # group 5 has no CUDA-core kernel, whatever the dtype
])
def test_tensor_core_decode(heads, kv_heads, kv_dtype, expected) -> None:
    assert decode_uses_tensor_cores(heads, kv_heads, kv_dtype) is expected


def test_fp32_has_no_flashinfer_kernels() -> None:
    assert unsupported_dtype("bfloat16", "bfloat16") is None and unsupported_dtype("float16", "float16") is None
    fp32 = unsupported_dtype("float32", "float32")
    assert fp32 is not None and "float32" in fp32 and "--dtype bfloat16" in fp32
    assert "kv_cache_dtype" in unsupported_dtype("bfloat16", "float32")


def _fake_nvcc(folder) -> str:
    path = folder / "bin" / "nvcc"
    path.parent.mkdir(parents=True)
    path.write_text("#!/bin/sh\n")
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return str(path)


def test_nvcc_is_found_where_flashinfer_looks(tmp_path) -> None:
    nvcc = _fake_nvcc(tmp_path / "cuda")
    assert find_nvcc({"CUDA_HOME": str(tmp_path / "cuda"), "PATH": ""}) == nvcc
    assert find_nvcc({"PATH": str(tmp_path / "cuda" / "bin")}) == nvcc
    if not os.access("/usr/local/cuda/bin/nvcc", os.X_OK):
        assert find_nvcc({"PATH": str(tmp_path / "empty")}) is None


def test_missing_nvcc_says_what_to_install() -> None:
    assert jit_problem("/usr/local/cuda/bin/nvcc", prebuilt=False) is None
    assert jit_problem(None, prebuilt=True) is None
    message = jit_problem(None, prebuilt=False)
    assert "nvcc" in message and "flashinfer-jit-cache" in message and "--attention-backend torch" in message


def test_backend_choice() -> None:
    def choose(name, device="cuda", dtype="bfloat16", importable=True, problem=None):
        return choose_attention_backend(name, device, dtype, dtype, importable, problem)

    assert choose("auto", device="cpu")[0] == "torch"
    assert choose("auto") == ("flashinfer", "auto: CUDA with flashinfer")
    assert choose("torch") == ("torch", "as asked")
    backend, why = choose("auto", dtype="float32")
    assert backend == "torch" and "no float32 kernels" in why
    backend, why = choose("auto", importable=False)
    assert backend == "torch" and "not installed" in why
    backend, why = choose("auto", problem="no nvcc")
    assert backend == "torch" and "no nvcc" in why
    with pytest.raises(InvalidRequest, match="no float32 kernels") as err:
        choose("flashinfer", dtype="float32")
    assert err.value.param == "attention_backend"
    with pytest.raises(InvalidRequest, match="needs a CUDA device"):
        choose("flashinfer", device="cpu")


def test_only_a_jit_cache_counts_as_prebuilt_attention_kernels(tmp_path, monkeypatch) -> None:
    """flashinfer-cubin holds no FA2 attention kernels: with it alone, plan() still compiles."""
    from kernels.flashinfer_support import has_prebuilt_kernels

    (tmp_path / "flashinfer_cubin").mkdir()
    (tmp_path / "flashinfer_cubin" / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert not has_prebuilt_kernels()
    (tmp_path / "flashinfer_jit_cache").mkdir()
    (tmp_path / "flashinfer_jit_cache" / "__init__.py").write_text("")
    assert has_prebuilt_kernels()
