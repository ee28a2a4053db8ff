"""GGUF's q5_0, q5_1, Q4_K, Q5_K and Q6_K blocks as integers: `decode` reads a tensor's bytes into
its unsigned values and scales, `encode` writes them back bit for bit, and `dequantize` gives the
weight. kernels/kquant_layout.py repacks the decoded integers for our kernel.

The formats, per block, little-endian (ggml's block_q5_0 ... block_q6_K):
  q5_0 (32 values, 22 bytes):  fp16 d, u32 qh, 16 bytes of nibbles    w = d * (u - 16)
  q5_1 (32 values, 24 bytes):  fp16 d, fp16 m, u32 qh, 16 bytes        w = d * u + m
  Q4_K (256 values, 144 bytes): fp16 d, fp16 dmin, 12 bytes of 6-bit (sc, m) per 32 values,
                                128 bytes of nibbles                    w = d * sc * u - dmin * m
  Q5_K (256 values, 176 bytes): as Q4_K, with 32 bytes qh before the nibbles
  Q6_K (256 values, 210 bytes): 128 bytes ql, 64 bytes qh, int8 sc per 16 values, fp16 d
                                                                        w = d * sc * (u - 32)
In q5_x, nibble byte j holds values j (low) and j + 16 (high) and qh bit i is value i's bit 4. In
Q4_K/Q5_K each 64 values take 32 nibble bytes: the low nibbles are the first 32 values, the high
ones the next; Q5_K's qh byte l holds bit 4 of value l of every 32 (bit s for sub-block s). Q6_K's
two halves of 128 values each take 64 ql bytes and 32 qh bytes: value 32t + l of a half is ql
byte l + 32 (t % 2), low nibble for t < 2, high for t >= 2, with bits 4-5 from qh byte l, bits 2t.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

QK_K = 256  # values per K-quant super-block
SUB = 32  # values per sub-block (a q5_x block is one)


@dataclass(frozen=True)
class Decoded:
    """A tensor's blocks as integers: enough to rebuild its bytes exactly."""

    values: torch.Tensor  # [rows, supers, sub_blocks, 32] uint8: u, the stored unsigned value
    d: torch.Tensor  # [rows, supers] fp16
    d2: torch.Tensor | None  # [rows, supers] fp16: q5_1's m, Q4_K/Q5_K's dmin; None otherwise
    scales: torch.Tensor | None  # [rows, supers, sub_blocks, 2]: Q4_K/Q5_K (sc, m) uint8, Q6_K int8 per 16

    def weight(self, name: str) -> torch.Tensor:
        """The weight [rows, in] in fp32."""
        u = self.values.float()
        d = self.d.float()[..., None, None]
        if name == "q5_0":
            w = d * (u - 16)
        elif name == "q5_1":
            assert self.d2 is not None
            w = d * u + self.d2.float()[..., None, None]
        elif name in ("q4_k", "q5_k"):
            assert self.d2 is not None and self.scales is not None
            sc, m = self.scales[..., 0].float(), self.scales[..., 1].float()
            w = d * sc[..., None] * u - (self.d2.float()[..., None] * m)[..., None]
        else:
            assert self.scales is not None
            sc = self.scales.float().repeat_interleave(16, dim=-1)  # per value, [.., sub, 32]
            w = d * sc * (u - 32)
        return w.reshape(u.shape[0], -1)


def _f16(raw: torch.Tensor) -> torch.Tensor:
    return raw.contiguous().view(torch.float16).squeeze(-1)


def _f16_bytes(x: torch.Tensor) -> torch.Tensor:
    return x.contiguous().unsqueeze(-1).view(torch.uint8)


def _bits(words: torch.Tensor, count: int) -> torch.Tensor:
    """Little-endian bytes [..., n] -> their `count` bits [..., count] (0/1, uint8), bit i of the whole."""
    shifts = torch.arange(8, dtype=torch.uint8)
    return ((words[..., :, None] >> shifts) & 1).reshape(*words.shape[:-1], -1)[..., :count]


def _pack_bits(bits: torch.Tensor) -> torch.Tensor:
    """The inverse of _bits: [..., 8n] 0/1 -> [..., n] bytes."""
    weights = (1 << torch.arange(8, dtype=torch.int32))
    return (bits.reshape(*bits.shape[:-1], -1, 8).to(torch.int32) * weights).sum(-1).to(torch.uint8)


def decode(rows: torch.Tensor, name: str) -> Decoded:
    """A GGUF tensor's bytes [rows, in / block values * block bytes] as integers."""
    n = rows.shape[0]
    if name in ("q5_0", "q5_1"):
        b = rows.view(n, -1, 22 if name == "q5_0" else 24)
        head = 2 if name == "q5_0" else 4
        qh = _bits(b[..., head: head + 4], 32)
        qs = b[..., head + 4:]
        u = torch.cat([qs & 0x0F, qs >> 4], dim=-1) | (qh << 4)
        d2 = _f16(b[..., 2:4]) if name == "q5_1" else None
        return Decoded(u[:, :, None, :], _f16(b[..., 0:2]), d2, None)
    if name in ("q4_k", "q5_k"):
        b = rows.view(n, -1, 144 if name == "q4_k" else 176)
        qs = b[..., -128:].reshape(n, -1, 4, 32)
        u = torch.stack([qs & 0x0F, qs >> 4], dim=3).reshape(n, -1, 8, 32)  # sub-block 2i, 2i + 1
        if name == "q5_k":
            qh = b[..., 16:48]  # [n, S, 32]: bit s of byte l is sub-block s's value l
            u = u | ((qh[:, :, None, :] >> torch.arange(8, dtype=torch.uint8)[:, None]) & 1) << 4
        return Decoded(u, _f16(b[..., 0:2]), _f16(b[..., 2:4]), _unpack_scales(b[..., 4:16]))
    if name == "q6_k":
        b = rows.view(n, -1, 210)
        ql = b[..., :128].reshape(n, -1, 2, 2, 32)  # [n, S, half, t % 2, l]
        qh = b[..., 128:192].reshape(n, -1, 2, 1, 32)
        low = torch.stack([ql[..., 0, :], ql[..., 1, :]], dim=3) & 0x0F  # t = 0, 1
        high = torch.stack([ql[..., 0, :], ql[..., 1, :]], dim=3) >> 4  # t = 2, 3
        nib = torch.cat([low, high], dim=3)  # [n, S, half, t, l]
        top = (qh >> (2 * torch.arange(4, dtype=torch.uint8))[:, None]) & 3
        u = (nib | (top << 4)).reshape(n, -1, 8, 32)
        scales = b[..., 192:208].contiguous().view(torch.int8).reshape(n, -1, 8, 2)
        return Decoded(u, _f16(b[..., 208:210]), None, scales)
    raise ValueError(f"not a format of this module: {name!r}")


def encode(dec: Decoded, name: str) -> torch.Tensor:
    """The inverse of `decode`: the tensor's bytes [rows, bytes per row]."""
    u = dec.values
    n = u.shape[0]
    if name in ("q5_0", "q5_1"):
        v = u[:, :, 0, :]
        qs = (v[..., :16] & 0x0F) | ((v[..., 16:] & 0x0F) << 4)
        fields = [_f16_bytes(dec.d)] + ([_f16_bytes(dec.d2)] if dec.d2 is not None else [])
        fields += [_pack_bits(v >> 4), qs]
        return torch.cat(fields, dim=-1).reshape(n, -1)
    if name in ("q4_k", "q5_k"):
        assert dec.d2 is not None and dec.scales is not None
        pairs = u.reshape(n, -1, 4, 2, 32) & 0x0F
        fields = [_f16_bytes(dec.d), _f16_bytes(dec.d2), _pack_scales(dec.scales)]
        if name == "q5_k":
            top = (u >> 4).to(torch.int32) << torch.arange(8, dtype=torch.int32)[:, None]
            fields.append(top.sum(2).to(torch.uint8))
        fields.append((pairs[..., 0, :] | (pairs[..., 1, :] << 4)).reshape(n, -1, 128))
        return torch.cat(fields, dim=-1).reshape(n, -1)
    if name == "q6_k":
        assert dec.scales is not None
        v = u.reshape(n, -1, 2, 4, 32)  # [n, S, half, t, l]
        nib = v & 0x0F
        ql = (nib[:, :, :, 0:2, :] | (nib[:, :, :, 2:4, :] << 4)).reshape(n, -1, 128)
        top = (v >> 4).to(torch.int32) << (2 * torch.arange(4, dtype=torch.int32))[:, None]
        qh = top.sum(3).to(torch.uint8).reshape(n, -1, 64)
        scales = dec.scales.reshape(n, -1, 16).contiguous().view(torch.uint8)
        return torch.cat([ql, qh, scales, _f16_bytes(dec.d)], dim=-1).reshape(n, -1)
    raise ValueError(f"not a format of this module: {name!r}")


def _unpack_scales(raw: torch.Tensor) -> torch.Tensor:
    """Q4_K/Q5_K's 12 bytes -> (sc, m) of the 8 sub-blocks [..., 8, 2] (ggml's get_scale_min_k4)."""
    s = raw.to(torch.int32)
    sc_lo, m_lo = s[..., 0:4] & 63, s[..., 4:8] & 63
    sc_hi = (s[..., 8:12] & 0x0F) | ((s[..., 0:4] >> 6) << 4)
    m_hi = (s[..., 8:12] >> 4) | ((s[..., 4:8] >> 6) << 4)
    sc, m = torch.cat([sc_lo, sc_hi], dim=-1), torch.cat([m_lo, m_hi], dim=-1)
    return torch.stack([sc, m], dim=-1).to(torch.uint8)


def _pack_scales(scales: torch.Tensor) -> torch.Tensor:
    """The inverse of _unpack_scales: [..., 8, 2] 6-bit values -> 12 bytes."""
    s = scales.to(torch.int32)
    sc, m = s[..., 0], s[..., 1]
    first = sc[..., 0:4] | ((sc[..., 4:8] >> 4) << 6)
    second = m[..., 0:4] | ((m[..., 4:8] >> 4) << 6)
    third = (sc[..., 4:8] & 0x0F) | ((m[..., 4:8] & 0x0F) << 4)
    return torch.cat([first, second, third], dim=-1).to(torch.uint8)
