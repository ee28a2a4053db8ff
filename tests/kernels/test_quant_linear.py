"""A Linear on GGUF blocks (kernels/quant_linear.py): installed from its blocks alone, through the
C++ kernel and through the torch fallback, against the kernels' own float64 reference of the same
blocks (kernels/gguf_blocks.py reference_linear; the kernel itself is held to gguf's blocks in
tests/kernels/csrc/test_quant_gemm.py)."""

from __future__ import annotations

from types import ModuleType

import pytest
import torch

from kernels import gguf_blocks as gb
from kernels.linear import Linear
from kernels.quant_linear import BlockQuantLinearMethod, install
from runtime.execution.cpu_kernels import load_cpu_kernels


@pytest.fixture(scope="module")
def kernels() -> ModuleType:
    module = load_cpu_kernels()
    assert module is not None, "the C++ CPU kernels are not built: run `python -m runtime.execution.cpu_kernels build`"
    return module


def _relative(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got.double() - want).abs().max() / want.abs().max().clamp(min=1e-30))


def test_a_layer_runs_from_its_blocks_alone(kernels: ModuleType) -> None:
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
