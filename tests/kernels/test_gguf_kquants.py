"""kernels/gguf_kquants.py and kernels/kquant_layout.py: the formats we read from files decode as
gguf-py decodes them (an outside reading of ggml's formats), encode back to the file's bytes, and
survive the kernel's repacking bit for bit."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf.quants import dequantize

from kernels import gguf_blocks as gb
from kernels import gguf_kquants, kquant_layout
from tests.kernels.csrc.test_quant_gemm_kquants import GGUF_TYPES, random_blocks


@pytest.mark.parametrize("name", list(GGUF_TYPES))
def test_blocks_decode_as_gguf_py_decodes_them(name: str) -> None:
    blocks = random_blocks(name, 11, 512, seed=1)
    theirs = dequantize(blocks.numpy(), GGUF_TYPES[name]).astype(np.float32)
    assert np.array_equal(gb.dequantize(blocks, gb.block_format(name)).numpy(), theirs)


@pytest.mark.parametrize("name", list(GGUF_TYPES))
def test_decoding_loses_no_bit(name: str) -> None:
    blocks = random_blocks(name, 5, 768, seed=2)
    assert torch.equal(gguf_kquants.encode(gguf_kquants.decode(blocks, name), name), blocks)


@pytest.mark.parametrize("name", list(GGUF_TYPES))
@pytest.mark.parametrize("rows", [1, 8, 13])
def test_rows_repack_by_eight_and_back(name: str, rows: int) -> None:
    fmt = gb.block_format(name)
    blocks = random_blocks(name, rows, 512, seed=rows)
    grouped = gb.interleave_rows(blocks, fmt)
    assert grouped.shape == (-(-rows // 8), kquant_layout.group_bytes(name, 512))
    # The layout keeps every bit: Q6_K and q5_x at the file's size, Q4_K/Q5_K's 6-bit scales as bytes.
    extra = {"q4_k": 32, "q5_k": 32}.get(name, 0) * 2  # two super-blocks of 8 rows
    assert grouped.numel() == -(-rows // 8) * (8 * gb.row_bytes(fmt, 512) + extra)
    assert torch.equal(gb.deinterleave_rows(grouped, fmt, rows), blocks)


def test_the_high_bit_planes_are_where_the_kernel_reads_them() -> None:
    """One value's fifth bit set, in row 3 at value 21 (chunk c = 1, k = 1, high half s = 1): plane
    byte 4 * 3 + 1, bit 2 * 1 + 1."""
    dec = gguf_kquants.Decoded(torch.zeros(8, 1, 1, 32, dtype=torch.uint8), torch.ones(8, 1, dtype=torch.float16),
                               None, None)
    dec.values[3, 0, 0, 21] = 16
    grouped = kquant_layout.repack(dec, "q5_0")
    plane = grouped[0, 16:48]
    assert plane.nonzero().flatten().tolist() == [13] and int(plane[13]) == 1 << 3
