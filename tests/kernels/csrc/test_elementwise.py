"""The fused per-token kernels (kernels/csrc/elementwise.cpp: RMSNorm with the residual add, SiLU *
up, the rotary embedding) against float64 references within their roundings' worst case, at
widths that are not multiples of 8 or 16 (so nothing relies on whole vectors); and against the
torch ops they replace (kernels/norm.py, kernels/rotary.py): at most 1 ulp apart in bf16, within
fp32 rounding in fp32.

Why 1 ulp from the torch ops and not bit equality in bf16: both sides compute in fp32 and round
once to bf16, but the fp32 results differ in their last bits with the vector width and under
-ffast-math (contracted multiply-adds, vector exp), so a value near a rounding boundary can land
on the neighbouring bf16.
"""

from __future__ import annotations

from types import ModuleType

import pytest
import torch
import torch.nn.functional as F

from kernels.fused_ops import CpuFusedOps
from kernels.norm import RMSNorm
from kernels.rotary import RotaryEmbedding
from tests.kernels.csrc.layer_reference import rotary_table
from tests.kernels.csrc.rounding import FAST_ULPS, U32, UBF16, assert_within, gamma

DTYPES = [torch.float32, torch.bfloat16]


def _bf16_unit(dtype: torch.dtype) -> float:
    """The unit of the kernels' roundings to the activation dtype (none in fp32)."""
    return UBF16 if dtype == torch.bfloat16 else 0.0


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows,dim", [(1, 83), (5, 100), (40, 7)])
def test_rms_norm_matches_float64(kernels: ModuleType, dtype: torch.dtype, rows: int, dim: int) -> None:
    gen = torch.Generator().manual_seed(rows * dim)
    x, residual = (3 * torch.randn(rows, dim, generator=gen).to(dtype) for _ in range(2))
    weight = (torch.rand(dim, generator=gen) + 0.5).to(dtype)
    eps = 1e-6
    for res in (None, residual):
        out, summed = kernels.rms_norm(x, res, weight, eps)
        # The residual sum is one rounding of the exact sum (bf16 + bf16 is exact in fp32, or
        # the smaller part is below half a bf16 step), so it equals float64's rounded once.
        h = x.double() if res is None else (x.double() + res.double()).to(dtype).double()
        if res is not None:
            assert torch.equal(summed, h.to(dtype))
        want = h / torch.sqrt((h * h).mean(dim=-1, keepdim=True) + eps) * weight.double()
        # fp32: the sum of squares (all terms positive: relative gamma(dim)), the mean, the eps,
        # 1/sqrt (FAST_ULPS), the product and the weight's; bf16 adds the normalised value's
        # rounding and the output's.
        u = _bf16_unit(dtype)
        rel = (1 + u) ** 2 * (1 + float(gamma(dim + 4)) + FAST_ULPS * U32) - 1
        assert_within(out, want, rel * want.abs(), f"rms_norm ({'with' if res is not None else 'no'} residual)")


@pytest.mark.parametrize("dtype", DTYPES)
def test_silu_mul_matches_float64(kernels: ModuleType, dtype: torch.dtype) -> None:
    gate_up = (4 * torch.randn(7, 2 * 37, generator=torch.Generator().manual_seed(1))).to(dtype)
    gate, up = gate_up.double().chunk(2, dim=-1)
    want = gate / (1 + torch.exp(-gate)) * up
    # exp (FAST_ULPS, and 1 + e^-a only shrinks its relative error), the add, the division
    # (FAST_ULPS), the product; bf16: SiLU's rounding and the output's.
    u = _bf16_unit(dtype)
    rel = (1 + u) ** 2 * (1 + (2 * FAST_ULPS + 3) * U32) - 1
    assert_within(kernels.silu_mul(gate_up), want, rel * want.abs(), "silu_mul")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("dim", [36, 10])
def test_rotary_on_strided_rows_matches_float64(kernels: ModuleType, dtype: torch.dtype, dim: int) -> None:
    gen = torch.Generator().manual_seed(dim)
    qkv = torch.randn(9, (5 + 2 + 2) * dim, generator=gen).to(dtype)
    qk = qkv[:, : 7 * dim].view(9, 7, dim)  # rows strided by the v columns, as in the model
    table = rotary_table(torch.tensor([0, 1, 2, 50, 51, 127, 3, 3, 9]), dim, dtype)
    got = kernels.rotary(qk, table)
    half = dim // 2
    x, t = qk.double(), table.double()[:, None, :]
    cos, sin = t[..., :dim], t[..., dim:]
    rotated = torch.cat([x[..., half:], x[..., :half]], dim=-1)  # rotate_half's sign is in the table
    want = x * cos + rotated * sin
    # fp32: the two products and the sum; bf16: x * cos is rounded to bf16 before the sum, and the
    # output again.
    u = _bf16_unit(dtype)
    bound = (u + 3 * U32) * (1 + u) * ((x * cos).abs() + (rotated * sin).abs()) + u * want.abs()
    assert_within(got, want, bound, "rotary")
    assert got.is_contiguous() and got.shape == qk.shape


def test_bad_widths_are_refused(kernels: ModuleType) -> None:
    with pytest.raises(RuntimeError, match="odd width"):
        kernels.silu_mul(torch.randn(2, 9))
    with pytest.raises(RuntimeError, match=r"table \[T, 2 \* D\]"):
        kernels.rotary(torch.randn(3, 2, 9), torch.randn(3, 18))
    with pytest.raises(RuntimeError, match="contiguous heads"):
        kernels.rotary(torch.randn(3, 8, 2).transpose(1, 2), torch.randn(3, 16))
    with pytest.raises(RuntimeError, match="weight"):
        kernels.rms_norm(torch.randn(2, 9), None, torch.ones(8), 1e-6)


def bf16_ulps(got: torch.Tensor, want: torch.Tensor) -> torch.Tensor:
    """How many representable bf16 values lie between each pair (0: equal; +0 and -0 are equal)."""

    def ordered(x: torch.Tensor) -> torch.Tensor:  # bf16 bits as integers in the order of the values
        bits = x.contiguous().view(torch.int16).to(torch.int32)
        return torch.where(bits < 0, -(bits & 0x7FFF), bits)

    return (ordered(got) - ordered(want)).abs()


def _close(got: torch.Tensor, want: torch.Tensor) -> None:
    assert got.dtype == want.dtype and got.shape == want.shape
    if got.dtype == torch.bfloat16:
        ulps = bf16_ulps(got, want)
        assert int(ulps.max()) <= 1, (int(ulps.max()), (got.float() - want.float()).abs().max())
    else:
        torch.testing.assert_close(got, want, rtol=2e-6, atol=2e-6)


def test_ulp_distance_counts_representable_values() -> None:
    one = torch.tensor([1.0], dtype=torch.bfloat16)
    step = torch.tensor([1.0 + 2**-7], dtype=torch.bfloat16)  # the next bf16 above 1
    assert bf16_ulps(one, one).item() == 0 and bf16_ulps(one, step).item() == 1
    assert bf16_ulps(one, torch.tensor([1.0 + 2**-6], dtype=torch.bfloat16)).item() == 2
    zeros = torch.tensor([0.0, -0.0], dtype=torch.bfloat16)
    assert bf16_ulps(zeros, zeros.flip(0)).max().item() == 0
    tiny = torch.tensor([2**-133], dtype=torch.bfloat16)  # the smallest subnormal, either side of 0
    assert bf16_ulps(tiny, -tiny).item() == 2


@pytest.mark.parametrize("dtype", DTYPES)
def test_kernels_match_the_torch_ops(kernels: ModuleType, dtype: torch.dtype) -> None:
    """The torch path (the oracle the model falls back to) and the kernels round alike."""
    gen = torch.Generator().manual_seed(2)
    norm = RMSNorm(96, 1e-6, dtype=dtype)
    with torch.no_grad():
        norm.weight.copy_(torch.rand(96, generator=gen) + 0.5)
    x, residual = (torch.randn(64, 96, generator=gen).to(dtype) * 3 for _ in range(2))
    want_plain, (want_normed, want_sum) = norm(x), norm(x, residual)
    norm.kernels = CpuFusedOps(kernels)
    got_plain, (got_normed, got_sum) = norm(x), norm(x, residual)
    _close(got_plain, want_plain)
    _close(got_normed, want_normed)
    assert torch.equal(got_sum, want_sum)  # the residual sum is one rounding either way

    gate_up = torch.randn(7, 2 * 40, generator=gen).to(dtype) * 4
    gate, up = gate_up.chunk(2, dim=-1)
    _close(kernels.silu_mul(gate_up), F.silu(gate) * up)

    rotary = RotaryEmbedding(32, 128, 10000.0, dtype=dtype)
    qk = torch.randn(9, (4 + 2 + 2) * 32, generator=gen).to(dtype)[:, : 6 * 32].view(9, 6, 32)
    rows = rotary.lookup(torch.tensor([0, 1, 2, 50, 51, 127, 3, 3, 9]))
    _close(kernels.rotary(qk, rows.table), RotaryEmbedding.rotate(qk, rows))
