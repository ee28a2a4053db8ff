"""Our fused C++ CPU kernels for the per-token ops (RMSNorm with the residual add, SiLU * up, the
rotary embedding) against the torch ops they replace: at most 1 ulp apart in bf16, within fp32
rounding in fp32; and a whole model with them against one without.

Why 1 ulp and not bit equality in bf16: both sides compute in fp32 and round once to bf16, but
the fp32 results differ in their last bits with the vector width (AVX2's 8 lanes against
AVX-512's 16 change the order of the sums) and under -ffast-math (contracted multiply-adds,
vector exp), so a value near a rounding boundary can land on the neighbouring bf16."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from kernels.fused_ops import CpuFusedOps
from kernels.norm import RMSNorm
from kernels.rotary import RotaryEmbedding
from runtime.execution.cpu_kernels import load_cpu_kernels

DTYPES = [torch.float32, torch.bfloat16]


@pytest.fixture(scope="module")
def kernels():
    module = load_cpu_kernels()
    assert module is not None, "the C++ CPU kernels are not built: run `python -m runtime.execution.cpu_kernels build`"
    return module


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


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows", [1, 5, 64])
def test_rms_norm_with_and_without_residual(kernels, dtype: torch.dtype, rows: int) -> None:
    gen = torch.Generator().manual_seed(rows)
    norm = RMSNorm(96, 1e-6, dtype=dtype)
    with torch.no_grad():
        norm.weight.copy_(torch.rand(96, generator=gen) + 0.5)
    x, residual = (torch.randn(rows, 96, generator=gen).to(dtype) * 3 for _ in range(2))
    want_plain, (want_normed, want_sum) = norm(x), norm(x, residual)
    norm.kernels = CpuFusedOps(kernels)
    got_plain, (got_normed, got_sum) = norm(x), norm(x, residual)
    _close(got_plain, want_plain)
    _close(got_normed, want_normed)
    assert torch.equal(got_sum, want_sum)  # the residual sum is one rounding either way


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
def test_silu_mul(kernels, dtype: torch.dtype) -> None:
    gate_up = torch.randn(7, 2 * 40, generator=torch.Generator().manual_seed(1)).to(dtype) * 4
    gate, up = gate_up.chunk(2, dim=-1)
    _close(kernels.silu_mul(gate_up), F.silu(gate) * up)


@pytest.mark.parametrize("dtype", DTYPES)
def test_rotary_on_strided_rows(kernels, dtype: torch.dtype) -> None:
    rotary = RotaryEmbedding(32, 128, 10000.0, dtype=dtype)
    gen = torch.Generator().manual_seed(2)
    qkv = torch.randn(9, (4 + 2 + 2) * 32, generator=gen).to(dtype)
    qk = qkv[:, : 6 * 32].view(9, 6, 32)  # rows strided by the v columns, as in the model
    rows = rotary.lookup(torch.tensor([0, 1, 2, 50, 51, 127, 3, 3, 9]))
    _close(kernels.rotary(qk, rows.table), RotaryEmbedding.rotate(qk, rows))


@pytest.mark.parametrize("dtype,tol", [("float32", 1e-5), ("bfloat16", 2e-2)])
def test_model_with_kernels_matches_without(default_model_path: str, dtype: str, tol: float) -> None:
    """One loaded model, run with its kernels and then with them switched off (a model load
    costs more than the forwards; the weights are the same either way)."""
    from runtime.execution.static_batch import StaticBatch

    prompt = list(range(200, 260))
    engine = StaticBatch.create(default_model_path, dtype=dtype, max_total_tokens=512, max_running_requests=2)
    assert engine.runner.backend.decoder.kernels is not None  # the first run goes through them
    logits = []
    for with_kernels in (True, False):
        if not with_kernels:
            engine.runner.model.use_fused_ops(None)
            engine.runner.backend.decoder.kernels = None
        seq = engine.new_seq(prompt)
        for token in (300, 301, 302, 303):  # the same tokens for both: prefill, then decode steps
            result = engine.step([seq], keep_logits=True)
            seq.tokens.append(token)
        logits.append(result.last_logits[0])
        engine.release([seq])
    err = ((logits[0] - logits[1]).norm() / logits[1].norm()).item()
    assert err <= tol, err
