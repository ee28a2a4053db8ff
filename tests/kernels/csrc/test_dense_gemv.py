"""The dense GEMV (kernels/csrc/dense_gemv.cpp): x [M <= 16, K] @ W^T (+ bias) on a plain fp32 or
bf16 weight, against the float64 product within fp32's worst-case bound.

M covers each path (1 and 2 rows meet a weight row at a time; 3 and 4 take tiles of 3 weight
rows; from 5, tiles of 6 under AVX-512) and the row tiles' remainders (5 = 4+1, 7 = 4+3, 10 =
4+4+2, 16 = 4*4); N leaves weight rows after the last whole tile; K is never a multiple of 8,
so every dot product ends in its scalar tail, and at K = 1001 the threads split N unevenly.
"""

from __future__ import annotations

from types import ModuleType

import pytest
import torch

from tests.kernels.csrc.rounding import UBF16, assert_within, gamma

# (M, N, K, x dtype, weight dtype, bias): every (x, weight) dtype pair with and without a bias.
F32, BF16 = torch.float32, torch.bfloat16
CASES = [(1, 7, 13, F32, F32, True), (2, 13, 100, BF16, F32, False), (3, 20, 37, F32, BF16, False),
         (4, 5, 77, BF16, BF16, True), (5, 37, 1001, F32, F32, False), (7, 14, 59, BF16, BF16, False),
         (10, 19, 9, F32, BF16, True), (16, 23, 250, BF16, F32, True), (1, 40, 1001, BF16, BF16, False)]


@pytest.mark.parametrize("m,n,k,x_dtype,w_dtype,with_bias", CASES)
def test_gemv_matches_float64(kernels: ModuleType, m: int, n: int, k: int, x_dtype: torch.dtype,
                              w_dtype: torch.dtype, with_bias: bool) -> None:
    gen = torch.Generator().manual_seed(m * 1000 + n + k)
    x = torch.randn(m, k, generator=gen).to(x_dtype)
    w = torch.randn(n, k, generator=gen).to(w_dtype)
    bias = torch.randn(n, generator=gen) if with_bias else None
    got = kernels.dense_gemv(x, w, bias)
    assert got.dtype == x_dtype and got.shape == (m, n)
    bias64 = torch.zeros(n, dtype=torch.float64) if bias is None else bias.double()
    want = x.double() @ w.double().T + bias64
    # Both operands are exact in fp32; k products and sums in any order, then the bias: within
    # gamma(k + 2) of the sum of the terms' magnitudes. A bf16 x gives a bf16 output: one more
    # rounding.
    bound = float(gamma(k + 2)) * (x.double().abs() @ w.double().abs().T + bias64.abs())
    if x_dtype == torch.bfloat16:
        bound = bound + UBF16 * (want.abs() + bound)
    assert_within(got, want, bound, f"dense_gemv {m}x{k} @ {n}x{k}^T")


def test_bad_shapes_are_refused(kernels: ModuleType) -> None:
    w = torch.randn(5, 24)
    with pytest.raises(RuntimeError, match="1 to 16 rows, got 17"):
        kernels.dense_gemv(torch.randn(17, 24), w)
    with pytest.raises(RuntimeError, match="1 to 16 rows, got 0"):
        kernels.dense_gemv(torch.randn(0, 24), w)
    with pytest.raises(RuntimeError, match=r"x \[M, K\], w \[N, K\]"):
        kernels.dense_gemv(torch.randn(2, 23), w)
    with pytest.raises(RuntimeError, match="row-major"):
        kernels.dense_gemv(torch.randn(2, 5), w.T)
    with pytest.raises(RuntimeError, match="fp32 or bf16 weight"):
        kernels.dense_gemv(torch.randn(2, 24), w.half())
    with pytest.raises(RuntimeError, match="bias"):
        kernels.dense_gemv(torch.randn(2, 24), w, torch.randn(4))
