"""A linear whose weight lives only as GGUF blocks (kernels/gguf_blocks.py KERNEL_FORMATS):
`BlockQuantLinearMethod`, and `BlockPartsLinearMethod` for a fused one whose parts differ in format.

The layer keeps no full-precision copy: `install` drops its weight. Every call, decode row or
prefill chunk, goes through our C++ kernel (kernels/csrc/quant_gemm.cpp), which quantizes each
activation row to 8-bit blocks and multiplies them with the weight blocks in integers. Measured
on the AVX-512 machine (docs/benchmarks.md, `scripts/bench_quant_linear.py`), it is faster than
decoding the blocks into a transient weight for oneDNN at every row count from 1 to 512, and
level with oneDNN on a packed bf16 weight at 64-512 rows.

One kernel for every row count also makes a row's output independent of the call it is in: the
row's activation blocks depend on that row alone, the integer sums are exact, and the fp32 sums
over blocks run in one order for every row, tile and thread split. So a quantized model gives the
same logits for a token whether its prompt was prefilled whole, in chunks, or from a cached
prefix, and whatever else shares the batch (tests/kernels/csrc/test_quant_gemm.py holds the kernel
to that bit for bit).

The kernel runs in the variant chosen for this CPU (runtime/execution/device.py
`block_kernel_isa`). Without the built kernels (a warning was logged at start) the blocks are
dequantized per call by the torch reference: correct and slow, and without that independence.

With --enable-batch-variance, runtime/execution/engines.py may give a layer a library engine for
its calls of many rows (`use_dense`, kernels/block_engines.py: oneDNN on a dequantized copy, which
runs on the CPU's matrix engine where it has one, or torch's int4 matmul). It costs that engine's
copy of the weight and the independence above: a row's result then depends on how many rows
share its call.
"""

from __future__ import annotations

from types import ModuleType

import torch
import torch.nn.functional as F

from kernels.block_engines import DenseEngine
from kernels.gguf_blocks import BlockFormat, deinterleave_rows, dequantize, interleave_rows, row_bytes
from kernels.linear import Linear, LinearMethod

ISA_CODES = {"avx2": 0, "avx512": 1}


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
        self.dense: DenseEngine | None = None  # use_dense's engine for calls of dense_from_rows rows or more
        self.dense_from_rows = 0

    @property
    def nbytes(self) -> int:
        return self.grouped.numel() + (0 if self.dense is None else self.dense.nbytes)

    def use_dense(self, engine: DenseEngine | None, from_rows: int = 0) -> None:
        """Run calls of at least `from_rows` rows of `engine`'s dtype on `engine` (None: none)."""
        self.dense, self.dense_from_rows = engine, from_rows

    def row_blocks(self) -> torch.Tensor:
        """The weight's blocks as rows again (a copy, for inspection and tests)."""
        return deinterleave_rows(self.grouped, self.fmt, self.out_features)

    def apply(self, layer: Linear, x: torch.Tensor) -> torch.Tensor:
        y = self.product(x.reshape(-1, self.in_features).contiguous(), layer.bias)
        return y.reshape(*x.shape[:-1], y.shape[-1])

    def product(self, rows: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        """rows [M, in] @ W^T (+ bias)."""
        y: torch.Tensor
        if self.dense is not None and rows.shape[0] >= self.dense_from_rows and rows.dtype == self.dense.dtype:
            y = self.dense.run(rows, bias)
        elif self.kernels is None:
            y = F.linear(rows, dequantize(self.row_blocks(), self.fmt).to(rows.dtype), bias)
        else:
            y = self.kernels.quant_linear(rows, self.grouped, self.fmt.code, self.isa_code, self.out_features, bias)
        return y


class BlockPartsLinearMethod(LinearMethod):
    """A fused linear (q/k/v, gate/up) whose parts the file stores in different block formats, as
    llama-quantize's mixes do (a Q4_K_M file's attn_v in q8_0 beside q5_0 q and k): each part runs
    its own block kernel and the outputs are concatenated, so no part is requantized."""

    full_precision = False

    def __init__(self, parts: list[BlockQuantLinearMethod]) -> None:
        self.parts = parts
        self.out_features = sum(part.out_features for part in parts)
        self.in_features = parts[0].in_features

    @property
    def nbytes(self) -> int:
        return sum(part.nbytes for part in self.parts)

    def part_biases(self, bias: torch.Tensor | None) -> list[torch.Tensor | None]:
        """`bias` cut into the parts' slices (None for each without one)."""
        if bias is None:
            return [None] * len(self.parts)
        return list(bias.split([part.out_features for part in self.parts]))

    def apply(self, layer: Linear, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, self.in_features).contiguous()
        ys = [part.product(rows, bias) for part, bias in zip(self.parts, self.part_biases(layer.bias), strict=True)]
        y = torch.cat(ys, dim=-1)
        return y.reshape(*x.shape[:-1], y.shape[-1])


def block_parts(method: LinearMethod) -> list[BlockQuantLinearMethod]:
    """The block kernels a linear's method computes with, in the order of its outputs: a fused
    layer's parts, the method itself, or none (a full-precision method)."""
    if isinstance(method, BlockPartsLinearMethod):
        return method.parts
    return [method] if isinstance(method, BlockQuantLinearMethod) else []


def install(layer: Linear, blocks: torch.Tensor, fmt: BlockFormat, kernels: ModuleType | None, isa: str) -> None:
    """Make `layer` compute from `blocks` and drop its full-precision weight (a tied head's
    weight is the embedding table, which the embedding keeps)."""
    if blocks.shape[0] != layer.out_features:
        raise ValueError(f"{fmt.name} blocks have {blocks.shape[0]} rows for a layer of {layer.out_features} outputs")
    layer.method = BlockQuantLinearMethod(blocks, fmt, layer.in_features, kernels, isa)
    layer.weight = None
    layer.packed = None


def install_parts(layer: Linear, parts: list[tuple[torch.Tensor, BlockFormat]], kernels: ModuleType | None,
                  isa: str) -> None:
    """Make fused `layer` compute each part (rows, format), in order, from its own blocks."""
    methods = [BlockQuantLinearMethod(rows, fmt, layer.in_features, kernels, isa) for rows, fmt in parts]
    if sum(m.out_features for m in methods) != layer.out_features:
        raise ValueError(f"block parts have {sum(m.out_features for m in methods)} rows for a layer of "
                         f"{layer.out_features} outputs")
    layer.method = BlockPartsLinearMethod(methods)
    layer.weight = None
    layer.packed = None
