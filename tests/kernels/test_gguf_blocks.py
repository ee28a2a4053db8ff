"""kernels/gguf_blocks.py, the torch reference of GGUF's q8_0/q4_0/q4_1 blocks: its layout
against gguf-py's own (de)quantizers (an outside reading of the format), and its error bounds."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType, quants

from kernels import gguf_blocks as gb

GGML_TYPES = {"q8_0": GGMLQuantizationType.Q8_0, "q4_0": GGMLQuantizationType.Q4_0, "q4_1": GGMLQuantizationType.Q4_1}


@pytest.mark.parametrize("name", list(gb.FORMATS))
def test_our_blocks_decode_as_gguf_py_decodes_them(name: str) -> None:
    fmt = gb.FORMATS[name]
    w = torch.randn(7, 96, generator=torch.Generator().manual_seed(1))
    blocks = gb.quantize(w, fmt)
    assert blocks.dtype == torch.uint8 and tuple(blocks.shape) == (7, gb.row_bytes(fmt, 96))
    theirs = quants.dequantize(blocks.numpy(), GGML_TYPES[name])
    assert np.array_equal(gb.dequantize(blocks, fmt).numpy(), theirs)


@pytest.mark.parametrize("name", list(gb.FORMATS))
def test_gguf_py_blocks_decode_alike_and_requantize_close(name: str) -> None:
    fmt = gb.FORMATS[name]
    w = np.random.default_rng(2).standard_normal((5, 64)).astype(np.float32)
    theirs = torch.from_numpy(quants.quantize(w, GGML_TYPES[name]))
    decoded = gb.dequantize(theirs, fmt)
    assert torch.equal(decoded, torch.from_numpy(quants.dequantize(theirs.numpy(), GGML_TYPES[name])))
    # Ours quantize within half a step of each block's scale (theirs round the same values).
    step = decoded.abs().reshape(5, -1, gb.QK).amax(-1).repeat_interleave(gb.QK, dim=1)
    ours = gb.dequantize(gb.quantize(torch.from_numpy(w), fmt), fmt)
    levels = 127 if name == "q8_0" else 7.5
    assert ((ours - torch.from_numpy(w)).abs() <= step / levels * 0.5 + 1e-3).all()


def test_activation_blocks_hold_their_invariants() -> None:
    x = torch.randn(3, 96) * 4
    x[1, :32] = 0  # an all-zero block: scale 0, values 0
    q, d, s = gb.quantize_activations(x)
    assert q.dtype == torch.int8 and q.abs().max() <= 127
    assert d[1, 0] == 0 and (q[1, :32] == 0).all() and s[1, 0] == 0
    assert torch.allclose(q.float().reshape(3, -1, 32) * d[..., None], x.reshape(3, -1, 32), atol=float(d.max()) / 2)
    assert torch.equal(s, d * q.float().reshape(3, -1, 32).sum(-1))


def test_bad_shapes_are_refused() -> None:
    with pytest.raises(ValueError, match="divisible by 32"):
        gb.quantize(torch.randn(4, 40), gb.FORMATS["q8_0"])
    with pytest.raises(ValueError, match="unknown block format"):
        gb.block_format("q3_k")


@pytest.mark.parametrize("name", list(gb.FORMATS))
@pytest.mark.parametrize("rows", [1, 8, 13])
def test_rows_interleave_by_eight_and_back(name: str, rows: int) -> None:
    fmt = gb.FORMATS[name]
    blocks = gb.quantize(torch.randn(rows, 64), fmt)
    grouped = gb.interleave_rows(blocks, fmt)
    groups = -(-rows // gb.GROUP_ROWS)
    assert tuple(grouped.shape) == (groups, gb.GROUP_ROWS * blocks.shape[1])
    # Group 0, block 0 starts with the 8 rows' scales (fp16, padding rows 0).
    scales = grouped[0, : 2 * gb.GROUP_ROWS].view(torch.float16)[: min(rows, 8)]
    assert torch.equal(scales, blocks[: min(rows, 8), :2].contiguous().view(torch.float16).squeeze(-1))
    assert torch.equal(gb.deinterleave_rows(grouped, fmt, rows), blocks)
