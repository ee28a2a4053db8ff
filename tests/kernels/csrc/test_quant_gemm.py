"""The quant GEMM (kernels/csrc/quant_gemm.cpp, `quant_linear`) against float64 products built
without our block code: weights quantized and decoded by the `gguf` package, activations
quantized by the documented rule in numpy (tests/kernels/csrc/block_reference.py).

Two comparisons per product:
  - with the activations' 8-bit blocks (x_deq @ W_deq^T + bias): only fp32 rounding separates
    them, so the bound is fp32's worst case over the terms the kernel adds;
  - with the unquantized x (x @ W_deq^T + bias): the activation rounding errors as well, bounded
    by Hoeffding's inequality (and never above their worst case).
Bit for bit where the arithmetic is: the activation blocks equal both the numpy rule and
kernels/gguf_blocks.py, and a row's output does not depend on the rows beside it.
"""

from __future__ import annotations

import math
from types import ModuleType

import numpy as np
import pytest
import torch

from kernels import gguf_blocks as gb
from kernels.quant_linear import ISA_CODES
from runtime.execution.device import cpu_capability
from tests.kernels.csrc.block_reference import (
    QK,
    TERM_FACTORS,
    block_headers,
    gguf_blocks,
    gguf_weight,
    quantize_activations,
)
from tests.kernels.csrc.rounding import UBF16, assert_within, gamma

ISAS = ["avx2"] + (["avx512"] if cpu_capability().block_kernel_isa == "avx512" else [])
# (M, N, K): M covers the 4-, 2- and 1-row tiles and their mixes (5 = 4+1, 7 = 4+2+1, 17 = 4*4+1);
# N is never a multiple of 8, so each product ends in a partial group of 8 rows, and under VNNI
# the 4-row tiles take groups in pairs: 45 (6 groups) ends in a pair with a partial second,
# 13 is one such pair, 49 (7 groups) leaves a group alone after its pairs. K from 1 to 48 blocks.
SHAPES = [(1, 1, 32), (2, 7, 64), (3, 37, 576), (4, 45, 96), (5, 13, 160), (7, 49, 96), (9, 33, 1536),
          (17, 5, 608)]
# Hoeffding: n independent errors e_k in [-h_k, h_k] give P(|sum e_k w_k| >= t) <= 2 exp(-t^2 /
# (2 sum h_k^2 w_k^2)); t = HOEFFDING * sqrt(sum h_k^2 w_k^2) puts that below 1e-12 per output.
HOEFFDING = math.sqrt(2 * math.log(2e12))


class Product:
    """One random product's operands and their float64 references."""

    def __init__(self, name: str, m: int, n: int, k: int, dtype: torch.dtype, with_bias: bool, seed: int) -> None:
        rng = np.random.default_rng(seed)
        # Rows at scales from 1e-3 to 1e3, an offset so that the blocks' sums (s_a, which the
        # minimum and the corrections multiply) are far from 0, and, where a row has more than
        # one block, an all-zero block (d = 0).
        scales = np.logspace(-3, 3, m)[:, None]
        x = (rng.standard_normal((m, k)) + 0.3) * scales
        if k > QK:
            x[m // 2, :QK] = 0
        weight = 0.05 * rng.standard_normal((n, k)) + 0.02 * rng.standard_normal((n, 1))
        self.name, self.dtype = name, dtype
        self.x = torch.from_numpy(x.astype(np.float32)).to(dtype)
        self.blocks = gguf_blocks(weight, name)
        self.w = gguf_weight(self.blocks, name)
        self.bias = torch.from_numpy(rng.standard_normal(n).astype(np.float32)) if with_bias else None
        self.bias64 = np.zeros(n) if self.bias is None else self.bias.double().numpy()
        self.act = quantize_activations(self.x.float().numpy())

    def run(self, kernels: ModuleType, isa: str, rows: slice = slice(None)) -> torch.Tensor:
        fmt = gb.FORMATS[self.name]
        return kernels.quant_linear(self.x[rows], gb.interleave_rows(self.blocks, fmt), fmt.code, ISA_CODES[isa],
                                    self.w.shape[0], self.bias)

    def fp32_bound(self) -> np.ndarray:
        """|kernel - x_deq @ W^T - bias| in fp32 math, [M, N]. Per block pair the kernel adds two
        terms into a running fp32 sum (d_w d_a * dot and corr * s_a, each with one rounding of
        its own: d_w * d_a, s_a), then the bias: 2 nb + 3 roundings, one more for gguf's fp32
        q4_1 weights, each within U32 of at most sum |terms| + |bias|."""
        m, k = self.act.q.shape
        nb = k // QK
        d, minimum = block_headers(self.blocks, self.name)
        x_sums = np.abs(self.act.dequantized()).reshape(m, nb, QK).sum(-1)  # [M, nb]
        terms = x_sums @ (TERM_FACTORS[self.name] * d + minimum).T
        return float(gamma(2 * nb + 4)) * (terms + np.abs(self.bias64))

    def quantization_bound(self) -> np.ndarray:
        """|x_deq @ W^T - x @ W^T|, [M, N]: each activation is within h = d_a / 2 of its block
        value, plus the fp32 rounding of x * (1 / d_a) (|q| <= 127: under 2^-16 steps)."""
        h = np.repeat(self.act.d.astype(np.float64), QK, axis=1) * (0.5 + 2.0**-16)
        worst = h @ np.abs(self.w).T
        return np.minimum(worst, HOEFFDING * np.sqrt((h * h) @ (self.w * self.w).T))

    def check(self, got: torch.Tensor) -> None:
        assert got.dtype == self.dtype and got.shape == (self.x.shape[0], self.w.shape[0])
        out_unit = UBF16 if self.dtype == torch.bfloat16 else 0.0  # bf16 out: one more rounding
        want = self.act.dequantized() @ self.w.T + self.bias64
        bound = self.fp32_bound()
        assert_within(got, torch.from_numpy(want), torch.from_numpy(bound + out_unit * (np.abs(want) + bound)),
                      "against the quantized activations")
        exact = self.x.double().numpy() @ self.w.T + self.bias64
        loose = bound + self.quantization_bound()
        assert_within(got, torch.from_numpy(exact), torch.from_numpy(loose + out_unit * (np.abs(exact) + loose)),
                      "against the unquantized activations")


def _cases() -> list[tuple[str, str, tuple[int, int, int], torch.dtype, bool]]:
    """Every ISA x format x shape; the shapes alternate fp32/bf16 and, in pairs, bias/none, so each
    format meets every (dtype, bias) pair in each ISA."""
    out = []
    for isa in ISAS:
        for name in gb.FORMATS:
            for i, shape in enumerate(SHAPES):
                out.append((isa, name, shape, [torch.float32, torch.bfloat16][i % 2], i // 2 % 2 == 0))
    return out


@pytest.mark.parametrize("isa,name,shape,dtype,with_bias", _cases())
def test_products_match_float64(kernels: ModuleType, isa: str, name: str, shape: tuple[int, int, int],
                                dtype: torch.dtype, with_bias: bool) -> None:
    m, n, k = shape
    product = Product(name, m, n, k, dtype, with_bias, seed=m * 1000 + n + k)
    product.check(product.run(kernels, isa))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_activation_blocks_follow_the_rule_bit_for_bit(kernels: ModuleType, dtype: torch.dtype) -> None:
    """The kernel's blocks equal the numpy rule's and kernels/gguf_blocks.py's; bf16 rows are
    read as they are (widened in registers): the blocks of their fp32 copy."""
    x = (torch.randn(5, 608, generator=torch.Generator().manual_seed(1)) * torch.logspace(-3, 3, 608)).to(dtype)
    x[2, 64:96] = 0  # a block of zeros: d = 0, q = 0
    got = kernels.quantize_q8_rows(x)
    rule = quantize_activations(x.float().numpy())
    for ours, theirs in zip(got, (rule.q, rule.d, rule.s)):
        assert torch.equal(ours, torch.from_numpy(theirs))
    for ours, torch_reference in zip(got, gb.quantize_activations(x.float())):
        assert torch.equal(ours, torch_reference)


@pytest.mark.parametrize("isa", ISAS)
def test_bf16_activations_bias_and_empty_batches(kernels: ModuleType, isa: str) -> None:
    product = Product("q4_1", 6, 10, 96, torch.bfloat16, True, seed=2)
    product.check(product.run(kernels, isa))
    assert product.run(kernels, isa, slice(0, 0)).shape == (0, 10)


def test_the_variants_agree_within_their_bounds(kernels: ModuleType) -> None:
    if len(ISAS) < 2:
        pytest.skip("this CPU runs only the AVX2 variant")
    product = Product("q4_0", 7, 40, 576, torch.float32, False, seed=3)
    a, b = (product.run(kernels, isa) for isa in ISAS)
    assert_within(a, b.double(), torch.from_numpy(2 * product.fp32_bound()), "AVX2 against AVX-512")


def test_malformed_blocks_are_refused(kernels: ModuleType) -> None:
    fmt = gb.FORMATS["q8_0"]
    with pytest.raises(RuntimeError, match="rows grouped by 8"):
        kernels.quant_linear(torch.randn(1, 64), torch.zeros(1, 10, dtype=torch.uint8), fmt.code, 0, 3)
    with pytest.raises(RuntimeError, match="multiple of 32"):
        kernels.quant_linear(torch.randn(1, 40), torch.zeros(1, 272, dtype=torch.uint8), fmt.code, 0, 3)
    with pytest.raises(RuntimeError, match="unknown block format"):
        kernels.quant_linear(torch.randn(1, 32), torch.zeros(1, 272, dtype=torch.uint8), 9, 0, 3)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_rows_output_does_not_depend_on_its_call(kernels: ModuleType, isa: str, dtype: torch.dtype) -> None:
    """Batch invariance: a row's product is the same bits alone, among 2, 5, 17 or 300 rows and at
    any position (the 4-, 2- and 1-row tiles all sum in one order), so a quantized model's tokens
    do not depend on chunking, caching or batching."""
    product = Product("q4_1", 300, 44, 608, dtype, False, seed=7)
    whole = product.run(kernels, isa)
    for start, rows in [(0, 1), (3, 2), (7, 5), (11, 17), (283, 17)]:
        assert torch.equal(product.run(kernels, isa, slice(start, start + rows)), whole[start:start + rows])

