"""Our C++ kernels on GGUF blocks (kernels/csrc/quant_gemm.cpp) against the torch reference of the
same blocks (kernels/gguf_blocks.py): every format, odd shapes, both ISA variants.

Bit-exact where the arithmetic is integer: the activations' 8-bit blocks (scales, values, sums)
equal the reference's bit for bit, and so does every block's integer dot product; what remains is
fp32 summation over blocks in the kernel's order, held to the float64 sum within fp32 rounding.
"""

from __future__ import annotations

import pytest
import torch

from kernels import gguf_blocks as gb
from kernels.linear import Linear
from kernels.quant_linear import ISA_CODES, BlockQuantLinearMethod, install
from runtime.execution.cpu_kernels import load_cpu_kernels
from runtime.execution.device import cpu_capability

ISAS = ["avx2"] + (["avx512"] if cpu_capability().block_kernel_isa == "avx512" else [])
# 4-row tiles take row groups two at a time (AVX-512): (4, 45, 96) ends in a pair whose second
# group is partial, (8, 13, 64) is one pair of a full and a partial group.
SHAPES = [(1, 1, 32), (1, 49, 96), (2, 7, 64), (3, 37, 576), (4, 8, 32), (5, 64, 160), (9, 33, 1536), (17, 5, 608),
          (4, 45, 96), (8, 13, 64)]


@pytest.fixture(scope="module")
def kernels():
    module = load_cpu_kernels()
    assert module is not None, "the C++ CPU kernels are not built: run `python -m runtime.execution.cpu_kernels build`"
    return module


def _relative(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got.double() - want).abs().max() / want.abs().max().clamp(min=1e-30))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_activation_blocks_are_the_references_bit_for_bit(kernels, dtype: torch.dtype) -> None:
    """bf16 rows are read as they are (widened in registers): the blocks of their fp32 copy."""
    x = (torch.randn(5, 608) * torch.logspace(-3, 3, 608)).to(dtype)  # scales across six decades
    x[2, 64:96] = 0
    for got, want in zip(kernels.quantize_q8_rows(x), gb.quantize_activations(x.float())):
        assert torch.equal(got, want)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("name", list(gb.FORMATS))
@pytest.mark.parametrize("m,n,k", SHAPES)
def test_products_equal_the_reference(kernels, isa: str, name: str, m: int, n: int, k: int) -> None:
    fmt = gb.FORMATS[name]
    gen = torch.Generator().manual_seed(m * 1000 + n + k)
    x = torch.randn(m, k, generator=gen)
    blocks = gb.quantize(torch.randn(n, k, generator=gen) * 0.05, fmt)
    want = gb.reference_linear(x, blocks, fmt)
    got = kernels.quant_linear(x, gb.interleave_rows(blocks, fmt), fmt.code, ISA_CODES[isa], n)
    assert got.dtype == torch.float32 and got.shape == (m, n)
    assert _relative(got, want) < 2e-6


@pytest.mark.parametrize("isa", ISAS)
def test_bf16_activations_bias_and_empty_batches(kernels, isa: str) -> None:
    fmt = gb.FORMATS["q4_1"]
    x = torch.randn(6, 96).bfloat16()
    blocks = gb.quantize(torch.randn(10, 96), fmt)
    bias = torch.randn(10)
    grouped = gb.interleave_rows(blocks, fmt)
    got = kernels.quant_linear(x, grouped, fmt.code, ISA_CODES[isa], 10, bias)
    want = gb.reference_linear(x.float(), blocks, fmt) + bias.double()
    assert got.dtype == torch.bfloat16 and _relative(got, want) < 1e-2  # one bf16 rounding
    assert kernels.quant_linear(x[:0], grouped, fmt.code, ISA_CODES[isa], 10).shape == (0, 10)


def test_the_variants_agree_closely(kernels) -> None:
    if len(ISAS) < 2:
        pytest.skip("this CPU runs only the AVX2 variant")
    fmt = gb.FORMATS["q4_0"]
    x, blocks = torch.randn(7, 576), gb.quantize(torch.randn(40, 576), fmt)
    grouped = gb.interleave_rows(blocks, fmt)
    a, b = (kernels.quant_linear(x, grouped, fmt.code, ISA_CODES[isa], 40) for isa in ISAS)
    assert _relative(a, b.double()) < 2e-6


def test_malformed_blocks_are_refused(kernels) -> None:
    fmt = gb.FORMATS["q8_0"]
    with pytest.raises(RuntimeError, match="rows grouped by 8"):
        kernels.quant_linear(torch.randn(1, 64), torch.zeros(1, 10, dtype=torch.uint8), fmt.code, 0, 3)
    with pytest.raises(RuntimeError, match="multiple of 32"):
        kernels.quant_linear(torch.randn(1, 40), torch.zeros(1, 272, dtype=torch.uint8), fmt.code, 0, 3)


def test_a_layer_runs_from_its_blocks_alone(kernels) -> None:
    layer = Linear(64, 12, bias=True)
    layer.weight.data.normal_()
    layer.bias.data.normal_()
    fmt = gb.FORMATS["q8_0"]
    blocks = gb.quantize(layer.weight.detach(), fmt)
    x = torch.randn(3, 2, 64)
    install(layer, blocks, fmt, kernels, "avx2")
    layer.pack()  # nothing to pack: the blocks are the weight
    assert layer.weight is None and layer.packed is None
    want = gb.reference_linear(x.reshape(6, 64), blocks, fmt).reshape(3, 2, 12) + layer.bias.double()
    assert _relative(layer(x), want) < 2e-6
    # Without the built kernels the torch fallback computes the dequantized product (no 8-bit
    # activations: within their rounding of the kernel's).
    layer.method = BlockQuantLinearMethod(blocks, fmt, 64, None, "avx2")
    assert _relative(layer(x), want) < 2e-2


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_rows_output_does_not_depend_on_its_call(kernels, isa: str, dtype: torch.dtype) -> None:
    """Batch invariance: a row's product is the same bits alone, among 2, 5, 17 or 300 rows and at
    any position (the 4-, 2- and 1-row tiles all sum in one order), so a quantized model's tokens
    do not depend on chunking, caching or batching."""
    fmt = gb.FORMATS["q4_1"]
    gen = torch.Generator().manual_seed(7)
    grouped = gb.interleave_rows(gb.quantize(torch.randn(44, 608, generator=gen), fmt), fmt)
    x = torch.randn(300, 608, generator=gen).to(dtype)
    whole = kernels.quant_linear(x, grouped, fmt.code, ISA_CODES[isa], 44)
    for start, rows in [(0, 1), (3, 2), (7, 5), (11, 17), (283, 17)]:
        part = kernels.quant_linear(x[start:start + rows], grouped, fmt.code, ISA_CODES[isa], 44)
        assert torch.equal(part, whole[start:start + rows])
