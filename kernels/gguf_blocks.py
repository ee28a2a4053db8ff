"""GGUF's block formats q8_0, q4_0 and q4_1 in plain torch: the reference our C++ kernels are
held to, the quantizer `--quantization q8_0|q4_0|q4_1` uses, and the fallback product. The formats
we only read from files (q5_0, q5_1, Q4_K, Q5_K, Q6_K: FILE_FORMATS) go through the same
`dequantize`, `interleave_rows` and `deinterleave_rows`, in kernels/gguf_kquants.py and
kernels/kquant_layout.py.

A weight [out, in] is stored as `out` rows of `in / 32` blocks, each block as GGUF (and ggml)
lays it out, little-endian:
  q8_0: fp16 d, int8 q[32]                  w = d * q
  q4_0: fp16 d, 16 bytes of nibbles         w = d * (u - 8)
  q4_1: fp16 d, fp16 m, 16 bytes of nibbles w = d * u + m
where byte j of the nibbles holds value j in its low nibble and value j + 16 in its high one.
The rows are a uint8 tensor [out, in / 32 * block bytes], exactly the bytes of a GGUF tensor.

Our kernels read the rows interleaved by 8 (`interleave_rows`: the same bytes reordered, so that
per group of 8 rows and per block the 8 fp16 scales come first, then q4_1's 8 minimums, then the
8 rows' value bytes in chunks of 4: bytes 0-3 of rows 0..7, then bytes 4-7 of rows 0..7, ...;
rows padded with zero blocks to a multiple of 8).

`quantize_activations` is the activation side of the kernel (kernels/csrc/quant_gemm.cpp):
per block of 32, d = max|x| / 127, q = round-half-even(x * (1 / d)), s = d * sum(q); and
`reference_linear` computes the kernel's sum in float64 from the same integers.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kernels import gguf_kquants, kquant_layout

QK = 32  # values per block in every format here
GROUP_ROWS = 8  # rows interleaved per group for the kernels (interleave_rows)


@dataclass(frozen=True)
class BlockFormat:
    name: str
    code: int  # the kernel's format number (kernels/csrc/quant_gemm_variants.h Format)
    block_bytes: int
    header_bytes: int  # the fp16 scale (and minimum) before the values (q8_0, q4_x)
    block_values: int = QK


# The formats we quantize to (`--quantization`), in this module.
FORMATS = {
    "q8_0": BlockFormat("q8_0", 0, 2 + QK, 2),
    "q4_0": BlockFormat("q4_0", 1, 2 + QK // 2, 2),
    "q4_1": BlockFormat("q4_1", 2, 4 + QK // 2, 4),
}
# The formats we only read from files, in kernels/gguf_kquants.py and kernels/kquant_layout.py.
FILE_FORMATS = {
    "q5_0": BlockFormat("q5_0", 3, 22, 6),
    "q5_1": BlockFormat("q5_1", 4, 24, 8),
    "q4_k": BlockFormat("q4_k", 5, 144, 16, 256),
    "q5_k": BlockFormat("q5_k", 6, 176, 48, 256),
    "q6_k": BlockFormat("q6_k", 7, 210, 0, 256),
}
KERNEL_FORMATS = {**FORMATS, **FILE_FORMATS}  # every format our kernel runs


def block_format(name: str) -> BlockFormat:
    if name not in KERNEL_FORMATS:
        raise ValueError(f"unknown block format {name!r}; known: {', '.join(KERNEL_FORMATS)}")
    return KERNEL_FORMATS[name]


def row_bytes(fmt: BlockFormat, in_features: int) -> int:
    if in_features % fmt.block_values:
        raise ValueError(f"{fmt.name} needs in_features divisible by {fmt.block_values}, got {in_features}")
    return in_features // fmt.block_values * fmt.block_bytes


def _halves(raw: torch.Tensor) -> torch.Tensor:
    """fp16 values from a [..., 2] uint8 tensor of little-endian halves, as fp32 [...]."""
    return raw.contiguous().view(torch.float16).squeeze(-1).float()


def _as_bytes(values: torch.Tensor) -> torch.Tensor:
    """fp32 [...] as fp16, as a [..., 2] uint8 tensor."""
    return values.to(torch.float16).unsqueeze(-1).view(torch.uint8)


def split_blocks(blocks: torch.Tensor, fmt: BlockFormat) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(values [out, nb, 32] int16: signed q for q8_0, unsigned nibbles for q4; d [out, nb]; m or 0)."""
    out = blocks.shape[0]
    b = blocks.view(out, -1, fmt.block_bytes)
    d = _halves(b[..., 0:2])
    m = _halves(b[..., 2:4]) if fmt.name == "q4_1" else torch.zeros_like(d)
    body = b[..., fmt.header_bytes:]
    if fmt.name == "q8_0":
        values = body.contiguous().view(torch.int8).to(torch.int16)
    else:
        nibbles = body.to(torch.int16)
        values = torch.cat([nibbles & 0x0F, nibbles >> 4], dim=-1)
    return values, d, m


def dequantize(blocks: torch.Tensor, fmt: BlockFormat) -> torch.Tensor:
    """The weight [out, in] in fp32."""
    if fmt.name in FILE_FORMATS:
        return gguf_kquants.decode(blocks, fmt.name).weight(fmt.name)
    values, d, m = split_blocks(blocks, fmt)
    offset = 8 if fmt.name == "q4_0" else 0
    w = (values.float() - offset) * d[..., None] + m[..., None]
    return w.reshape(blocks.shape[0], -1)


def quantize(weight: torch.Tensor, fmt: BlockFormat) -> torch.Tensor:
    """`weight` [out, in] as rows of `fmt` blocks (uint8 [out, in / 32 * block bytes]).

    The scales are rounded to fp16 before the values are quantized against them, so that each
    value is within half a step of what the stored blocks decode to (q4_0 keeps ggml's choice
    of the scale: the value of largest magnitude maps to -8).
    """
    out, cols = weight.shape
    row_bytes(fmt, cols)
    x = weight.detach().float().reshape(out, -1, QK)
    if fmt.name == "q8_0":
        d = (x.abs().amax(-1) / 127).half().float()
        q = torch.round(x / torch.where(d == 0, 1.0, d)[..., None]).clamp_(-127, 127)
        body = q.to(torch.int8).view(torch.uint8)
        return torch.cat([_as_bytes(d), body], dim=-1).reshape(out, -1)
    if fmt.name == "q4_0":
        idx = x.abs().argmax(-1, keepdim=True)
        d = (x.gather(-1, idx).squeeze(-1) / -8).half().float()
        u = torch.round(x / torch.where(d == 0, 1.0, d)[..., None] + 8).clamp_(0, 15)
        header = _as_bytes(d)
    else:
        lo, hi = x.amin(-1), x.amax(-1)
        d = ((hi - lo) / 15).half().float()
        m = lo.half().float()
        u = torch.round((x - m[..., None]) / torch.where(d == 0, 1.0, d)[..., None]).clamp_(0, 15)
        header = torch.cat([_as_bytes(d), _as_bytes(m)], dim=-1)
    u8 = u.to(torch.uint8)
    body = u8[..., : QK // 2] | (u8[..., QK // 2 :] << 4)
    return torch.cat([header, body], dim=-1).reshape(out, -1)


def quantize_activations(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """x [M, K] as the kernel's 8-bit blocks: (q int8 [M, K], d fp32 [M, K/32], s = d * sum(q))."""
    rows = x.shape[0]
    xb = x.float().reshape(rows, -1, QK)
    d = xb.abs().amax(-1) / 127
    inv = torch.where(d != 0, 1.0 / d, torch.zeros_like(d))
    q = torch.round(xb * inv[..., None])
    s = d * q.sum(-1)
    return q.to(torch.int8).reshape(rows, -1), d, s


def reference_linear(x: torch.Tensor, blocks: torch.Tensor, fmt: BlockFormat) -> torch.Tensor:
    """The kernel's product in float64: the same integer block dot products, summed exactly."""
    q, da, sa = quantize_activations(x)
    values, dw, m = split_blocks(blocks, fmt)
    rows = x.shape[0]
    a = q.reshape(rows, -1, QK).double()
    dots = torch.einsum("mbi,nbi->mnb", a, values.double())  # exact: integers below 2^53
    scaled = (dots * da.double()[:, None, :] * dw.double()[None]).sum(-1)
    corr = -8 * dw if fmt.name == "q4_0" else m
    return scaled + sa.double() @ corr.double().T


def interleave_rows(blocks: torch.Tensor, fmt: BlockFormat) -> torch.Tensor:
    """Rows of blocks [out, bytes] -> groups of 8 rows [ceil(out / 8), 8 * bytes], the kernels' layout."""
    if fmt.name in FILE_FORMATS:
        return kquant_layout.repack(gguf_kquants.decode(blocks, fmt.name), fmt.name)
    pad = -blocks.shape[0] % GROUP_ROWS
    if pad:
        blocks = torch.cat([blocks, blocks.new_zeros(pad, blocks.shape[1])])
    groups = blocks.shape[0] // GROUP_ROWS
    g = blocks.view(groups, GROUP_ROWS, -1, fmt.block_bytes).permute(0, 2, 1, 3)  # [G, nb, 8, block]
    fields = [g[..., 0:2]]  # the scales
    if fmt.name == "q4_1":
        fields.append(g[..., 2:4])  # the minimums
    nb = g.shape[1]
    values = g[..., fmt.header_bytes:].reshape(groups, nb, GROUP_ROWS, -1, 4)  # [G, nb, 8, chunk, 4]
    fields.append(values.transpose(2, 3))  # per chunk of 4 bytes, the 8 rows' bytes
    return torch.cat([f.reshape(groups, nb, -1) for f in fields], dim=-1).reshape(groups, -1).contiguous()


def deinterleave_rows(grouped: torch.Tensor, fmt: BlockFormat, rows: int) -> torch.Tensor:
    """The inverse of `interleave_rows`: the first `rows` rows of blocks [rows, bytes]."""
    if fmt.name in FILE_FORMATS:
        return gguf_kquants.encode(kquant_layout.unpack(grouped, fmt.name, rows), fmt.name)
    groups = grouped.shape[0]
    g = grouped.view(groups, -1, GROUP_ROWS * fmt.block_bytes)  # [G, nb, group-block]
    nb = g.shape[1]
    header = GROUP_ROWS * fmt.header_bytes
    fields = [g[..., : 2 * GROUP_ROWS].reshape(groups, nb, GROUP_ROWS, 2)]
    if fmt.name == "q4_1":
        fields.append(g[..., 2 * GROUP_ROWS : header].reshape(groups, nb, GROUP_ROWS, 2))
    values = g[..., header:].reshape(groups, nb, -1, GROUP_ROWS, 4).transpose(2, 3)  # [G, nb, 8, chunk, 4]
    fields.append(values.reshape(groups, nb, GROUP_ROWS, -1))
    blocks = torch.cat(fields, dim=-1).permute(0, 2, 1, 3).reshape(groups * GROUP_ROWS, -1)
    return blocks[:rows].contiguous()
