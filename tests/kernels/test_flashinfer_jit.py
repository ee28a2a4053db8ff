"""The FlashInfer modules built ahead of time: which ones, named as FlashInfer names them (the
stand-in copies 0.6.18.post1's URI format; tests/kernels/test_flashinfer_signatures.py checks its
generators against the wheel), one build call for all, installed where FlashInfer's loader takes
them from, and their archives unpacked there."""

from __future__ import annotations

import sys
import tarfile
import types
from pathlib import Path

import pytest
import torch

from kernels.flashinfer_jit import AttentionLayout, build_modules, needed_modules, pack_libraries, unpack_libraries
from tests.kernels import fake_flashinfer_jit as jit

PREFILL_64 = ("batch_prefill_with_kv_cache_dtype_q_bf16_dtype_kv_bf16_dtype_o_bf16_dtype_idx_i32_head_dim_qk_64_"
              "head_dim_vo_64_posenc_0_use_swa_False_use_logits_cap_False_f16qk_False")
PREFILL_ARGS = (torch.bfloat16, torch.bfloat16, torch.bfloat16, torch.int32, 64, 64, 0, False, False, False)
DECODE_64 = ("batch_decode_with_kv_cache_dtype_q_bf16_dtype_kv_bf16_dtype_o_bf16_dtype_idx_i32_head_dim_qk_64_"
             "head_dim_vo_64_posenc_0_use_swa_False_use_logits_cap_False")


@pytest.fixture
def fake_jit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    for name in ("flashinfer.jit", *(f"flashinfer.jit.{sub}" for sub in ("norm", "rope", "sampling", "activation"))):
        monkeypatch.setitem(sys.modules, name, types.ModuleType("placeholder"))  # undone after the test
    return jit.install_module(tmp_path)


LLAMA_1B, QWEN_7B, SMOLLM2 = AttentionLayout(32, 8, 64), AttentionLayout(28, 4, 128), AttentionLayout(9, 3, 64)


def test_the_modules_our_calls_ask_for(fake_jit) -> None:  # type: ignore[no-untyped-def]
    # Groups 4 and 7 decode on tensor cores (the prefill module); group 3 on CUDA cores.
    modules = needed_modules([QWEN_7B, LLAMA_1B, SMOLLM2], [torch.bfloat16])
    assert [m.label for m in modules] == ["prefill-hd64-bfloat16", "decode-hd64-bfloat16", "prefill-hd128-bfloat16",
                                          "norm", "rope", "silu_and_mul"]
    assert [m.group for m in modules] == ["attention-hd64"] * 2 + ["attention-hd128"] + ["elementwise"] * 3
    assert [m.spec(fake_jit).name for m in modules[:2]] == [PREFILL_64, DECODE_64]
    assert [m.spec(fake_jit).name for m in modules[3:]] == ["norm", "rope", "silu_and_mul"]
    assert [m.label for m in needed_modules([LLAMA_1B, QWEN_7B], [torch.bfloat16], fused_ops=False)] == [
        "prefill-hd64-bfloat16", "prefill-hd128-bfloat16"]
    assert [m.label for m in needed_modules([LLAMA_1B], [torch.bfloat16], sampling=True)][-1] == "sampling"


def test_one_build_for_all_installed_where_calls_load_them(fake_jit, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    modules = needed_modules([LLAMA_1B, SMOLLM2, QWEN_7B], [torch.bfloat16])
    result = build_modules(modules, fake_jit)
    assert len(jit.BUILT[-1]) == 6 and result.prebuilt == []
    aot = Path(fake_jit.env.FLASHINFER_AOT_DIR)
    assert result.libraries[PREFILL_64] == aot / PREFILL_64 / f"{PREFILL_64}.so"
    assert jit.get_batch_prefill_module("fa2", *PREFILL_ARGS).path == result.libraries[PREFILL_64]  # no rebuild
    archive = tmp_path / "attention-hd64.tar.xz"
    pack_libraries({name: result.libraries[name] for name in (PREFILL_64, DECODE_64)}, archive)

    fresh = jit.install_module(tmp_path / "machine2")  # another machine, nothing built
    assert unpack_libraries(archive, Path(fresh.env.FLASHINFER_AOT_DIR)) == [PREFILL_64, DECODE_64]
    again = build_modules(modules, fresh)
    assert again.prebuilt == [PREFILL_64, DECODE_64] and len(jit.BUILT[-1]) == 4
    assert PREFILL_64 not in jit.BUILT[-1]
    assert again.libraries[PREFILL_64].read_bytes() == result.libraries[PREFILL_64].read_bytes()


def test_a_library_left_where_ninja_built_it_is_rebuilt_by_the_call(fake_jit) -> None:  # type: ignore[no-untyped-def]
    """FlashInfer's load path as the stand-in models it: a module build_jit_specs built, but not
    installed in the AOT directory, makes the call that loads it recompile it."""
    spec = fake_jit.gen_batch_prefill_module("fa2", *PREFILL_ARGS)
    fake_jit.build_jit_specs([spec])
    assert spec.jit_library_path.exists() and not spec.is_aot
    with pytest.raises(jit.LateCompile, match="holds no ninja log"):
        jit.get_batch_prefill_module("fa2", *PREFILL_ARGS)
    with pytest.raises(jit.LateCompile, match="never built"):
        jit.get_norm_module()


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
