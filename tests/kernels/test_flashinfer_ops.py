"""FlashInfer's fused per-token ops (over their stand-ins) against the torch ops they replace:
within a rounding step of bf16, the residual stream exact, q and k rotated in place through
strided views."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from kernels.flashinfer_ops import FlashInferFusedOps
from kernels.norm import RMSNorm
from kernels.rotary import RotaryEmbedding
from tests.kernels import fake_flashinfer_ops
from tests.runtime.execution.tiny_runner import fake_flashinfer  # noqa: F401 (a fixture)

BF16 = torch.bfloat16


def _ops(fake_flashinfer, rotary: RotaryEmbedding | None = None) -> FlashInferFusedOps:  # type: ignore[no-untyped-def]  # noqa: F811
    return FlashInferFusedOps(fake_flashinfer, rotary or RotaryEmbedding(64, 256, 10000.0, dtype=BF16))


def _close(got: torch.Tensor, want: torch.Tensor) -> None:
    torch.testing.assert_close(got.float(), want.float(), rtol=1.6e-2, atol=1.6e-2)  # a bf16 step or two


def test_norms_match_the_torch_ones(fake_flashinfer) -> None:  # noqa: F811
    gen = torch.Generator().manual_seed(0)
    norm = RMSNorm(128, 1e-6, dtype=BF16)
    with torch.no_grad():
        norm.weight.copy_(torch.rand(128, generator=gen) + 0.5)
    x, residual = (torch.randn(5, 128, generator=gen).to(BF16) * 3 for _ in range(2))
    want_plain, (want_normed, want_sum) = norm(x), norm(x, residual)
    norm.kernels = _ops(fake_flashinfer)
    x_in, residual_in = x.clone(), residual.clone()
    got_plain = norm(x_in)
    got_normed, got_sum = norm(x_in, residual_in)
    _close(got_plain, want_plain)
    _close(got_normed, want_normed)
    assert torch.equal(got_sum, want_sum)  # the residual stream: one rounding of the sum either way
    assert got_sum.data_ptr() == residual_in.data_ptr() and got_normed.data_ptr() == x_in.data_ptr()  # in place


def test_silu_mul_matches(fake_flashinfer) -> None:  # noqa: F811
    gate_up = torch.randn(7, 2 * 64, generator=torch.Generator().manual_seed(1)).to(BF16) * 4
    gate, up = gate_up.chunk(2, dim=-1)
    _close(_ops(fake_flashinfer).silu_mul(gate_up), F.silu(gate) * up)


@pytest.mark.parametrize("heads,kv_heads", [(4, 2), (3, 1)])
def test_rotary_in_place_on_strided_q_and_k(fake_flashinfer, heads: int, kv_heads: int) -> None:  # noqa: F811
    rotary = RotaryEmbedding(64, 256, 10000.0, dtype=BF16)
    qkv = torch.randn(9, (heads + 2 * kv_heads) * 64, generator=torch.Generator().manual_seed(2)).to(BF16)
    qk = qkv[:, : (heads + kv_heads) * 64].view(9, heads + kv_heads, 64)  # rows strided by v, as in the model
    rows = rotary.lookup(torch.tensor([0, 1, 2, 50, 51, 255, 3, 3, 9]))
    want = RotaryEmbedding.rotate(qk, rows)
    v_before = qkv[:, (heads + kv_heads) * 64 :].clone()
    got = _ops(fake_flashinfer, rotary).rotary(qk, rows)
    assert got.data_ptr() == qkv.data_ptr()  # rotated in place
    _close(got, want)
    assert torch.equal(qkv[:, (heads + kv_heads) * 64 :], v_before)  # v untouched


def test_the_stand_ins_refuse_what_flashinfer_refuses() -> None:
    with pytest.raises(TypeError, match="no torch.float32"):
        fake_flashinfer_ops.rmsnorm(torch.randn(2, 64), torch.ones(64))
    with pytest.raises(ValueError, match="float32"):
        fake_flashinfer_ops.apply_rope_with_cos_sin_cache_inplace(
            torch.zeros(2, dtype=torch.long), torch.zeros(2, 64, dtype=BF16), torch.zeros(2, 64, dtype=BF16), 64,
            torch.zeros(8, 64, dtype=BF16))
    with pytest.raises(ValueError, match="16 bytes"):
        fake_flashinfer_ops.silu_and_mul(torch.zeros(2, 6, dtype=BF16))
