"""The FlashInfer modules built ahead of time: which ones, named as FlashInfer names them (checked
by hand against flashinfer-python 0.6.18.post1's jit: the stand-in copies its URI format), one
build call for all, and their archives unpacked where FlashInfer's loader looks first."""

from __future__ import annotations

import sys
import tarfile
import types
from pathlib import Path

import pytest
import torch

from kernels.flashinfer_jit import build_modules, needed_modules, pack_libraries, unpack_libraries
from tests.kernels import fake_flashinfer_jit as jit

PREFILL_64 = ("batch_prefill_with_kv_cache_dtype_q_bf16_dtype_kv_bf16_dtype_o_bf16_dtype_idx_i32_head_dim_qk_64_"
              "head_dim_vo_64_posenc_0_use_swa_False_use_logits_cap_False_f16qk_False")
DECODE_64 = ("batch_decode_with_kv_cache_dtype_q_bf16_dtype_kv_bf16_dtype_o_bf16_dtype_idx_i32_head_dim_qk_64_"
             "head_dim_vo_64_posenc_0_use_swa_False_use_logits_cap_False")


@pytest.fixture
def fake_jit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    for name in ("flashinfer.jit", *(f"flashinfer.jit.{sub}" for sub in ("norm", "rope", "sampling", "activation"))):
        monkeypatch.setitem(sys.modules, name, types.ModuleType("placeholder"))  # undone after the test
    return jit.install_module(tmp_path)


def test_the_modules_our_calls_ask_for(fake_jit) -> None:  # type: ignore[no-untyped-def]
    modules = needed_modules([128, 64, 64], [torch.bfloat16])
    assert [m.label for m in modules] == ["prefill-hd64-bfloat16", "decode-hd64-bfloat16", "prefill-hd128-bfloat16",
                                          "decode-hd128-bfloat16", "norm", "rope", "silu_and_mul", "sampling"]
    assert [m.group for m in modules] == ["attention-hd64"] * 2 + ["attention-hd128"] * 2 + ["elementwise"] * 4
    assert [m.spec(fake_jit).name for m in modules[:2]] == [PREFILL_64, DECODE_64]
    assert [m.spec(fake_jit).name for m in modules[4:]] == ["norm", "rope", "silu_and_mul", "sampling"]
    # Tensor-core decode only (every model's group >= 4 in 16-bit KV), no fused ops.
    assert [m.kind for m in needed_modules([64], [torch.bfloat16], cuda_core_decode=False, fused_ops=False)] == [
        "prefill"]


def test_one_build_for_all_and_prebuilt_modules_skipped(fake_jit, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    modules = needed_modules([64, 128], [torch.bfloat16])
    result = build_modules(modules, fake_jit)
    assert len(jit.BUILT[-1]) == 8 and result.prebuilt == []
    archive = tmp_path / "attention-hd64.tar.xz"
    pack_libraries({name: result.libraries[name] for name in (PREFILL_64, DECODE_64)}, archive)

    fake_jit.env.FLASHINFER_JIT_DIR = tmp_path / "fresh"  # another machine, nothing built
    assert unpack_libraries(archive, Path(fake_jit.env.FLASHINFER_AOT_DIR)) == [PREFILL_64, DECODE_64]
    again = build_modules(modules, fake_jit)
    assert again.prebuilt == [PREFILL_64, DECODE_64] and len(jit.BUILT[-1]) == 6
    assert PREFILL_64 not in jit.BUILT[-1]
    assert again.libraries[PREFILL_64] == Path(fake_jit.env.FLASHINFER_AOT_DIR) / PREFILL_64 / f"{PREFILL_64}.so"
    assert again.libraries[PREFILL_64].read_bytes() == result.libraries[PREFILL_64].read_bytes()


@pytest.mark.parametrize("member", ["../evil.so", "/abs/x.so", "a/b.so", "a/a.so/c", "a/"])
def test_unpack_refuses_anything_but_the_aot_layout(tmp_path: Path, member: str) -> None:
    archive = tmp_path / "bad.tar.xz"
    payload = tmp_path / "payload"
    payload.write_bytes(b"x")
    with tarfile.open(archive, "w:xz") as tar:
        tar.add(payload, arcname=member)
    with pytest.raises(ValueError, match="unexpected member"):
        unpack_libraries(archive, tmp_path / "aot")
    assert not (tmp_path / "aot").exists()
