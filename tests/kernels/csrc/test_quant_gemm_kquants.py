"""The quant GEMM on the formats we only read from files (q5_0, q5_1, Q4_K, Q5_K, Q6_K) against
float64 products built without our block code: the weights decoded by the `gguf` package, the
activations quantized by block_reference's numpy rule. The weight blocks are random bytes with
finite, small fp16 scales, so every value bit, 6-bit scale and high-bit pattern occurs.

The bound is fp32's worst case over the terms the kernel adds per sub-block of 32: the scaled
integer dot (at most |scale| * max u per value) and the correction (|minimum or offset| per
value) against the activations' magnitudes. The scales and minimums it needs come from our
decoder (kernels/gguf_kquants.py), whose values are themselves held to gguf's bit for bit in
tests/kernels/test_gguf_kquants.py; the products' reference never does.
"""

from __future__ import annotations

from types import ModuleType

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType
from gguf.quants import dequantize

from kernels import gguf_blocks as gb
from kernels import gguf_kquants
from kernels.quant_linear import ISA_CODES
from runtime.execution.device import cpu_capability
from tests.kernels.csrc.block_reference import QK, quantize_activations
from tests.kernels.csrc.rounding import UBF16, assert_within, gamma

ISAS = ["avx2"] + (["avx512"] if cpu_capability().block_kernel_isa == "avx512" else [])
GGUF_TYPES = {"q5_0": GGMLQuantizationType.Q5_0, "q5_1": GGMLQuantizationType.Q5_1,
              "q4_k": GGMLQuantizationType.Q4_K, "q5_k": GGMLQuantizationType.Q5_K,
              "q6_k": GGMLQuantizationType.Q6_K}
MAX_U = {"q5_0": 31, "q5_1": 31, "q4_k": 15, "q5_k": 31, "q6_k": 63}
# (M, N, K): the 4-, 2- and 1-row tiles and their mixes, N never a multiple of 8, K 1 to 6 super-blocks.
SHAPES = [(1, 13, 256), (2, 7, 512), (5, 37, 768), (7, 49, 256), (17, 9, 1536)]


def random_blocks(name: str, n: int, k: int, seed: int) -> torch.Tensor:
    """Random rows of `name` blocks [n, bytes], every fp16 field a small positive scale."""
    fmt = gb.block_format(name)
    gen = torch.Generator().manual_seed(seed)
    blocks = torch.randint(0, 256, (n, k // fmt.block_values, fmt.block_bytes), dtype=torch.uint8, generator=gen)
    halves = {"q5_0": [0], "q5_1": [0, 2], "q4_k": [0, 2], "q5_k": [0, 2], "q6_k": [208]}[name]
    scale = 2e-3 if name == "q6_k" else 2e-2
    for at in halves:
        values = (torch.rand(blocks.shape[:2], generator=gen) * scale + scale / 20).half()
        blocks[..., at: at + 2] = values.unsqueeze(-1).view(torch.uint8)
    return blocks.reshape(n, -1)


def term_bounds(blocks: torch.Tensor, name: str) -> np.ndarray:
    """Per weight [N, K]: the largest magnitude of the kernel's two terms per unit of activation."""
    dec = gguf_kquants.decode(blocks, name)
    d = dec.d.double().abs()[..., None, None]
    if name in ("q4_k", "q5_k"):
        assert dec.scales is not None and dec.d2 is not None
        scale = d * dec.scales[..., 0].double()[..., None]
        corr = (dec.d2.double().abs()[..., None] * dec.scales[..., 1].double())[..., None]
    elif name == "q6_k":
        assert dec.scales is not None
        scale = d * dec.scales.double().abs().repeat_interleave(16, dim=-1)
        corr = 32 * scale
    else:
        scale = d
        corr = 16 * d if name == "q5_0" else dec.d2.double().abs()[..., None, None]  # type: ignore[union-attr]
    terms = (MAX_U[name] * scale + corr).expand(dec.values.shape)
    return terms.reshape(blocks.shape[0], -1).numpy()


def _cases() -> list[tuple[str, str, tuple[int, int, int], torch.dtype, bool]]:
    out = []
    for isa in ISAS:
        for name in GGUF_TYPES:
            for i, shape in enumerate(SHAPES):
                out.append((isa, name, shape, [torch.float32, torch.bfloat16][i % 2], i // 2 % 2 == 0))
    return out


@pytest.mark.parametrize("isa,name,shape,dtype,with_bias", _cases())
def test_products_match_float64(kernels: ModuleType, isa: str, name: str, shape: tuple[int, int, int],
                                dtype: torch.dtype, with_bias: bool) -> None:
    m, n, k = shape
    rng = np.random.default_rng(m * n + k)
    x = torch.from_numpy(((rng.standard_normal((m, k)) + 0.3) * np.logspace(-2, 2, m)[:, None]).astype(np.float32))
    x = x.to(dtype)
    blocks = random_blocks(name, n, k, seed=k + n)
    w = dequantize(blocks.numpy(), GGUF_TYPES[name]).astype(np.float64)
    bias = torch.from_numpy(rng.standard_normal(n).astype(np.float32)) if with_bias else None
    bias64 = np.zeros(n) if bias is None else bias.double().numpy()
    fmt = gb.block_format(name)
    got = kernels.quant_linear(x, gb.interleave_rows(blocks, fmt), fmt.code, ISA_CODES[isa], n, bias)
    assert got.dtype == dtype and got.shape == (m, n)
    act = quantize_activations(x.float().numpy())
    xa = act.dequantized()
    want = xa @ w.T + bias64
    # Per sub-block two fp32 terms into a running sum, each with a rounding or two of its own; gguf's
    # fp32 weights one more; then the bias.
    bound = float(gamma(3 * (k // QK) + 4)) * (np.abs(xa) @ term_bounds(blocks, name).T + np.abs(bias64))
    out_unit = UBF16 if dtype == torch.bfloat16 else 0.0
    assert_within(got, torch.from_numpy(want), torch.from_numpy(bound + out_unit * (np.abs(want) + bound)),
                  f"{name} against float64")


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("name", list(GGUF_TYPES))
def test_a_rows_output_does_not_depend_on_its_call(kernels: ModuleType, isa: str, name: str) -> None:
    """Batch invariance, as for the other formats: a row's product is the same bits in any call."""
    fmt = gb.block_format(name)
    grouped = gb.interleave_rows(random_blocks(name, 44, 512, seed=3), fmt)
    x = torch.randn(300, 512, generator=torch.Generator().manual_seed(5))
    whole = kernels.quant_linear(x, grouped, fmt.code, ISA_CODES[isa], 44, None)
    for start, rows in [(0, 1), (3, 2), (7, 5), (11, 17), (283, 17)]:
        part = kernels.quant_linear(x[start:start + rows], grouped, fmt.code, ISA_CODES[isa], 44, None)
        assert torch.equal(part, whole[start:start + rows])


def test_k_quant_rows_must_fill_super_blocks(kernels: ModuleType) -> None:
    fmt = gb.block_format("q4_k")
    with pytest.raises(RuntimeError, match="multiple of 256"):
        kernels.quant_linear(torch.randn(1, 288), torch.zeros(1, 8 * 162, dtype=torch.uint8), fmt.code, 0, 8)
