"""The quant GEMM's operands built without our own block code: weight blocks from the `gguf`
package (llama.cpp's Python reference quantizer), decoded by it, and the activations' 8-bit
blocks by the rule quant_gemm.cpp documents, written here again in numpy.

The only code of ours a test then uses is `kernels/gguf_blocks.py interleave_rows`, which
reorders the blocks' bytes into the layout the kernel reads (a permutation, checked by its own
tests), so an error shared by the kernel and kernels/gguf_blocks.py cannot cancel out here.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch
from gguf import GGMLQuantizationType
from gguf.quants import dequantize, quantize

QK = 32
GGUF_TYPES = {"q8_0": GGMLQuantizationType.Q8_0, "q4_0": GGMLQuantizationType.Q4_0,
              "q4_1": GGMLQuantizationType.Q4_1}
BLOCK_BYTES = {"q8_0": 34, "q4_0": 18, "q4_1": 20}
# A weight block's largest integer factor in the kernel's two fp32 terms per block pair: its
# values (q8_0's shifted to unsigned for VNNI, q + 128 <= 255) and the correction times s_a
# (128 d for q8_0 under VNNI, 8 d for q4_0); q4_1's correction is m itself.
TERM_FACTORS = {"q8_0": 255 + 128, "q4_0": 15 + 8, "q4_1": 15}


def gguf_blocks(weight: np.ndarray, name: str) -> torch.Tensor:
    """`weight` [n, k] as GGUF rows of blocks, uint8 [n, k / 32 * block bytes]."""
    raw = quantize(weight.astype(np.float32), GGUF_TYPES[name])
    return torch.from_numpy(np.ascontiguousarray(raw))


def gguf_weight(blocks: torch.Tensor, name: str) -> np.ndarray:
    """What the blocks decode to, by gguf, as float64 [n, k] (q8_0 and q4_0 exactly; q4_1's
    d * u + m is rounded once to fp32 by gguf, within U32 of each weight)."""
    return dequantize(blocks.numpy(), GGUF_TYPES[name]).astype(np.float64)


def block_headers(blocks: torch.Tensor, name: str) -> tuple[np.ndarray, np.ndarray]:
    """(|d|, |m|) per block, float64 [n, k / 32]: the fp16 scale and q4_1's fp16 minimum (else 0)."""
    b = blocks.numpy().reshape(blocks.shape[0], -1, BLOCK_BYTES[name])
    d = np.abs(np.ascontiguousarray(b[..., 0:2]).view(np.float16)[..., 0].astype(np.float64))
    m = np.zeros_like(d)
    if name == "q4_1":
        m = np.abs(np.ascontiguousarray(b[..., 2:4]).view(np.float16)[..., 0].astype(np.float64))
    return d, m


class ActBlocks(NamedTuple):
    q: np.ndarray  # int8 [m, k]
    d: np.ndarray  # fp32 [m, k / 32]
    s: np.ndarray  # fp32 [m, k / 32]: d * sum(q), rounded once

    def dequantized(self) -> np.ndarray:
        """d * q in float64 [m, k] (exact)."""
        rows = self.q.shape[0]
        values = self.q.astype(np.float64).reshape(rows, -1, QK) * self.d.astype(np.float64)[..., None]
        return values.reshape(rows, -1)


def quantize_activations(x: np.ndarray) -> ActBlocks:
    """The kernel's documented rule, per block of 32 of an fp32 row: d = max|x| / 127, q =
    round-half-to-even(x * (1 / d)), every step one IEEE fp32 operation (numpy's float32 division
    and product are correctly rounded, np.rint rounds half to even); d = 0 gives q = 0."""
    rows = x.shape[0]
    xb = x.astype(np.float32).reshape(rows, -1, QK)
    d = np.abs(xb).max(axis=-1) / np.float32(127)
    inv = np.where(d != 0, np.float32(1) / np.where(d != 0, d, np.float32(1)), np.float32(0)).astype(np.float32)
    q = np.rint(xb * inv[..., None])
    s = d * q.sum(axis=-1, dtype=np.float32)  # |sum| <= 32 * 127: exact in fp32
    return ActBlocks(q.astype(np.int8).reshape(rows, -1), d, s.astype(np.float32))
