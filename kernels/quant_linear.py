"""A linear whose weight lives only as GGUF blocks (q8_0, q4_0, q4_1): `BlockQuantLinearMethod`.

The layer keeps no full-precision copy: `install` drops its weight. How a call meets the blocks
depends on its rows (measured on the AVX-512 machine, docs/benchmarks.md; not yet on an AVX2 one):
- up to `int_max_rows` rows (decode): our C++ kernel (kernels/csrc/quant_gemm.cpp) multiplies
  8-bit activation blocks with the weight blocks in integers, streaming the blocks once;
- more rows (prefill, large batches): the product is compute-bound, and the BLAS (oneDNN)
  multiplies faster than our integer tiles; the kernel decodes the blocks into a transient
  weight in the activation dtype (C++, vectorized), which oneDNN then multiplies. The decoded
  weight lives for the one call. (Rounding the activations through the kernel's 8-bit blocks
  and multiplying fp32 weights would give the kernel's products, but costs 2.5x the prefill
  time, and buys no equality: 8-bit activations turn any difference in the order of fp32 sums
  into a whole rounding step somewhere, so a cached prefix or a chunk boundary can flip a
  near-tie with either path. The full-precision defaults keep that equality; llama.cpp, which
  quantizes its activations too, does not have it either.)
The integer kernel runs in the variant chosen for this CPU (runtime/execution/device.py
`block_kernel_isa`). Without the built kernels (a warning was logged at start) the blocks are
dequantized per call by the torch reference: correct and slow.
"""

from __future__ import annotations

from types import ModuleType

import torch
import torch.nn.functional as F

from kernels.gguf_blocks import BlockFormat, deinterleave_rows, dequantize, interleave_rows, row_bytes
from kernels.linear import Linear, LinearMethod

ISA_CODES = {"avx2": 0, "avx512": 1}
# Rows up to which the integer kernel beats decoding the blocks for the BLAS: 8 for the decoder's
# linears (576-3072 outputs); an output head of a whole vocabulary costs more to decode than to
# multiply at a few dozen rows, so it stays on the integer kernel up to 64 (measured, bf16 and
# fp32, on the AVX-512 machine; an AVX2 CPU's BLAS has half the vector width, which should move
# both crossovers up, not yet measured there).
INT_MAX_ROWS = 8
HEAD_INT_MAX_ROWS = 64
HEAD_MIN_OUTPUTS = 16384


class BlockQuantLinearMethod(LinearMethod):
    """x @ W^T (+ bias) from W's blocks, given as rows [out, in / 32 * block bytes] (uint8) and
    held interleaved by 8 rows (`gguf_blocks.interleave_rows`, the kernels' layout)."""

    full_precision = False

    def __init__(self, blocks: torch.Tensor, fmt: BlockFormat, in_features: int, kernels: ModuleType | None,
                 isa: str) -> None:
        expected = (blocks.shape[0], row_bytes(fmt, in_features))
        if blocks.dtype != torch.uint8 or tuple(blocks.shape) != expected:
            got = f"{blocks.dtype} {list(blocks.shape)}"
            raise ValueError(f"{fmt.name} blocks must be uint8 {list(expected)}, got {got}")
        self.grouped = interleave_rows(blocks, fmt)
        self.fmt = fmt
        self.in_features = in_features
        self.out_features = blocks.shape[0]
        self.kernels = kernels
        self.isa_code = ISA_CODES[isa]
        self.int_max_rows = HEAD_INT_MAX_ROWS if self.out_features >= HEAD_MIN_OUTPUTS else INT_MAX_ROWS

    @property
    def nbytes(self) -> int:
        return self.grouped.numel()

    def row_blocks(self) -> torch.Tensor:
        """The weight's blocks as rows again (a copy, for inspection and tests)."""
        return deinterleave_rows(self.grouped, self.fmt, self.out_features)

    def apply(self, layer: Linear, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, self.in_features).contiguous()
        y: torch.Tensor
        if self.kernels is None:
            y = F.linear(rows, dequantize(self.row_blocks(), self.fmt).to(x.dtype), layer.bias)
        elif rows.shape[0] <= self.int_max_rows:
            y = self.kernels.quant_linear(rows, self.grouped, self.fmt.code, self.isa_code, self.out_features,
                                          layer.bias)
        else:
            weight = self.kernels.dequantize_blocks(self.grouped, self.fmt.code, self.in_features, self.out_features,
                                                    rows.dtype)
            y = torch.ops.mkldnn._linear_pointwise(rows, weight, layer.bias, "none", [], "")
        return y.reshape(*x.shape[:-1], y.shape[-1])


def install(layer: Linear, blocks: torch.Tensor, fmt: BlockFormat, kernels: ModuleType | None, isa: str) -> None:
    """Make `layer` compute from `blocks` and drop its full-precision weight (a tied head's
    weight is the embedding table, which the embedding keeps)."""
    if blocks.shape[0] != layer.out_features:
        raise ValueError(f"{fmt.name} blocks have {blocks.shape[0]} rows for a layer of {layer.out_features} outputs")
    layer.method = BlockQuantLinearMethod(blocks, fmt, layer.in_features, kernels, isa)
    layer.weight = None
    layer.packed = None
