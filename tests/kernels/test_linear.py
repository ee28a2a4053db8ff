"""The linear layer agrees with F.linear for every row count, in fp32 and bf16, on this CPU.

Where the CPU computes a dtype natively (`runtime.execution.device.should_prepack`) the weight is prepacked
with oneDNN; elsewhere (bf16 on an AVX2-only CPU) the plain path runs and gives the same numbers.
`tests/runtime/execution/test_device.py` reruns this file with the AVX2 CPU emulated.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from kernels.linear import Linear, pack_weight
from runtime.execution.device import cpu_capability, should_prepack

CPU = torch.device("cpu")


def make_linear(dtype: torch.dtype, bias: bool) -> tuple[Linear, torch.Tensor, torch.Tensor | None]:
    gen = torch.Generator().manual_seed(0)
    layer = Linear(96, 160, bias=bias, dtype=dtype)
    with torch.no_grad():
        layer.weight.copy_(torch.randn(160, 96, generator=gen) * 0.1)
        if bias:
            layer.bias.copy_(torch.randn(160, generator=gen))
    weight = layer.weight.detach().clone()
    return layer, weight, None if layer.bias is None else layer.bias.detach().clone()


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 1e-2)])
@pytest.mark.parametrize("bias", [False, True])
def test_linear_matches_f_linear_on_this_cpu(dtype, tol, bias):
    layer, weight, b = make_linear(dtype, bias)
    if should_prepack(CPU, dtype):
        layer.pack()
        assert layer.packed is not None and layer.weight is None  # packed, plain copy dropped
    elif cpu_capability().source == "detected":
        # Not native here: oneDNN itself refuses (or fails the probe), so even a forced pack
        # leaves the plain path in place.
        layer.pack()
        assert layer.packed is None and layer.weight is not None
    for rows in (1, 7, 64):
        x = torch.randn(rows, 96, generator=torch.Generator().manual_seed(rows)).to(dtype)
        got, want = layer(x), F.linear(x, weight, b)
        assert got.dtype == dtype and got.shape == (rows, 160)
        err = ((got.float() - want.float()).norm() / want.float().norm()).item()
        assert err <= tol, (rows, err)


def test_fp32_always_packs():
    assert should_prepack(CPU, torch.float32)
    layer, _, _ = make_linear(torch.float32, False)
    layer.pack()
    assert layer.packed is not None


def test_unpacked_forward_and_idempotent_pack():
    layer, weight, _ = make_linear(torch.float32, False)
    x = torch.randn(3, 96)
    assert torch.equal(layer(x), F.linear(x, weight))
    layer.pack()
    packed = layer.packed
    layer.pack()
    assert layer.packed is packed


def test_pack_weight_is_cpu_only():
    meta = torch.empty(4, 4, device="meta")
    assert pack_weight(meta, None) is None
    assert not should_prepack(torch.device("meta"), torch.float32)


# ---- weight-only int8 ---------------------------------------------------------------------------

def test_quantize_int8_is_within_half_a_step():
    from kernels.linear import quantize_int8

    w = torch.randn(64, 96, generator=torch.Generator().manual_seed(3)) * 0.05
    w[5] = 0.0  # an all-zero channel must not divide by zero
    q, scales = quantize_int8(w)
    assert q.dtype == torch.int8 and scales.dtype == torch.bfloat16 and scales.shape == (64,)
    back = q.float() * scales.float()[:, None]
    assert ((back - w).abs() <= scales.float()[:, None] / 2 + 1e-12).all()
    assert q.abs().max() <= 127 and not back[5].any()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_int8_for_small_calls_packed_for_large(dtype):
    from kernels.linear import INT8_MAX_ROWS

    layer, weight, b = make_linear(dtype, True)
    layer.quantize_int8()
    dequant = layer.q_weight.float() * layer.q_scales.float()[:, None]
    layer.pack()
    for rows in (1, INT8_MAX_ROWS, INT8_MAX_ROWS + 1, 64):
        x = torch.randn(rows, 96, generator=torch.Generator().manual_seed(rows)).to(dtype)
        got = layer(x)
        assert got.dtype == dtype and got.shape == (rows, 160)
        if rows <= INT8_MAX_ROWS:  # the int8 weights, bf16 activations
            want = x.to(torch.bfloat16).float() @ dequant.T + b.float()
            tol = 1e-2
        else:  # the full-precision path, exactly as without quantization
            want, tol = F.linear(x, weight, b).float(), (1e-5 if dtype == torch.float32 else 1e-2)
        err = ((got.float() - want).norm() / want.norm()).item()
        assert err <= tol, (rows, err)


# ---- plain rows through our GEMV (fp32 decode) ----------------------------------------------------

def gemv_kernels():
    from runtime.execution.cpu_kernels import load_cpu_kernels

    kernels = load_cpu_kernels()
    if kernels is None:
        pytest.skip("the C++ CPU kernels are not built")
    return kernels


@pytest.mark.parametrize("w_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("x_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", [(160, 96), (13, 37), (5, 8), (7, 1), (577, 1536)])
def test_dense_gemv_matches_a_float64_product(w_dtype, x_dtype, shape):
    """Every row count the kernel takes (its one-row, tile and wide-tile paths), K with and without
    a tail past its 8- and 32-wide steps, N not a multiple of a tile, and bias."""
    kernels = gemv_kernels()
    n, k = shape
    gen = torch.Generator().manual_seed(n * k)
    w = torch.randn(n, k, generator=gen).to(w_dtype)
    bias = torch.randn(n, generator=gen)
    for rows in range(1, 17):
        x = torch.randn(rows, k, generator=gen).to(x_dtype)
        for b in (None, bias):
            got = kernels.dense_gemv(x, w, b)
            want = x.double() @ w.double().T + (0 if b is None else b.double())
            assert got.dtype == x_dtype and got.shape == (rows, n)
            tol = 1e-5 if x_dtype == torch.float32 else 8e-3  # bf16 out: the output's own rounding
            torch.testing.assert_close(got.double(), want, rtol=tol, atol=tol * 5)


def test_dense_gemv_refuses_what_it_cannot_run():
    kernels = gemv_kernels()
    w = torch.randn(16, 32)
    with pytest.raises(RuntimeError, match="1 to 16 rows"):
        kernels.dense_gemv(torch.randn(17, 32), w, None)
    with pytest.raises(RuntimeError, match="x \\[M, K\\]"):
        kernels.dense_gemv(torch.randn(1, 31), w, None)
    with pytest.raises(RuntimeError, match="fp32 or bf16 weight"):
        kernels.dense_gemv(torch.randn(1, 32), w.half(), None)


@pytest.mark.parametrize("bias", [False, True])
def test_row_gemv_method_keeps_the_plain_weight_and_agrees_at_every_size(bias):
    from kernels.linear import GEMV_MAX_ROWS, RowGemvLinearMethod

    layer, weight, b = make_linear(torch.float32, bias)
    layer.method = RowGemvLinearMethod(gemv_kernels())
    layer.pack()
    assert layer.packed is None and layer.weight is not None  # never packed: the kernel reads the rows
    for rows in (1, GEMV_MAX_ROWS, GEMV_MAX_ROWS + 1, 64):
        x = torch.randn(2, rows, 96, generator=torch.Generator().manual_seed(rows))  # leading dims kept
        got, want = layer(x), F.linear(x, weight, b)
        assert got.shape == (2, rows, 160)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
