"""Library engines that can take a block linear's calls of many rows (runtime/execution/engines.py
decides whether one does, by measuring, and only with --enable-batch-variance):

- `onednn`: the blocks dequantized once into a oneDNN-packed copy in the activations' dtype (bf16
  runs on the CPU's matrix engine where it has one: AMX tiles on Xeons, AVX-512 BF16 on Zen 4).
  Its memory: one value of that dtype per weight.
- `int4pack`: torch's weight-only int4 matmul (`_weight_int4pack_mm_for_cpu`, groups of 32) on
  the q4 blocks as they are: w = (u - 8) * scale + zero with scale d and zero m + 8d (q4_1) or 0
  (q4_0), the scales and zeros rounded to the activations' dtype. Its memory: half a byte per
  weight, and the scales.

Each is checked against the blocks on a probe call when it is made; None where the library
cannot run it here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from kernels.gguf_blocks import BlockFormat, dequantize, split_blocks
from kernels.linear import pack_weight, packed_linear

INT4_GROUP = 32  # values per scale: GGUF's block


@dataclass(frozen=True)
class DenseEngine:
    """A linear's weight held for a library's matmul: y = run(x, bias)."""

    name: str
    dtype: torch.dtype  # the activations it takes
    nbytes: int
    run: Callable[[torch.Tensor, torch.Tensor | None], torch.Tensor]


def onednn(blocks: torch.Tensor, fmt: BlockFormat, dtype: torch.dtype) -> DenseEngine | None:
    weight = dequantize(blocks, fmt).to(dtype)
    packed = pack_weight(weight, None)
    if packed is None:
        return None
    return DenseEngine(f"onednn-{_name(dtype)}", dtype, weight.numel() * dtype.itemsize,
                       lambda x, bias: packed_linear(x, packed, bias))


def int4pack(blocks: torch.Tensor, fmt: BlockFormat, dtype: torch.dtype) -> DenseEngine | None:
    if fmt.name not in ("q4_0", "q4_1"):
        return None
    values, d, m = split_blocks(blocks, fmt)  # values [out, blocks, 32] in 0..15
    out = blocks.shape[0]
    zero = m + 8 * d if fmt.name == "q4_1" else torch.zeros_like(d)
    try:
        packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(values.reshape(out, -1).to(torch.int32), 1)
        scales = torch.stack([d, zero], dim=-1).transpose(0, 1).contiguous().to(dtype)  # [blocks, out, 2]

        def run(x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
            y: torch.Tensor = torch.ops.aten._weight_int4pack_mm_for_cpu(x, packed, INT4_GROUP, scales)
            return y if bias is None else y + bias

        probe = torch.ones((1, values.shape[1] * values.shape[2]), dtype=dtype)
        want = probe.float() @ dequantize(blocks, fmt).T
        if not torch.allclose(run(probe, None).float(), want, rtol=2e-2, atol=2e-2 * float(want.abs().max())):
            return None
    except (RuntimeError, NotImplementedError):
        return None
    nbytes = packed.numel() * packed.element_size() + scales.numel() * scales.element_size()
    return DenseEngine("int4pack", dtype, nbytes, run)


CANDIDATES: tuple[Callable[[torch.Tensor, BlockFormat, torch.dtype], DenseEngine | None], ...] = (onednn, int4pack)


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")
