"""The layout our kernel reads q5_0, q5_1, Q4_K, Q5_K and Q6_K in (kernels/csrc/quant_gemm_variants.h
KLayout): the decoded integers of 8 rows at a time, so that lane r of a vector is row r.

Per group of 8 rows and super-block (one block of 32 for q5_x, 256 values for the K-quants):
  the 8 rows' fp16 d, then (q5_1, Q4_K, Q5_K) their fp16 m or dmin;
  per sub-block of 32 values:
    K-quants: 8 bytes then 8 bytes: Q4_K/Q5_K's u8 sc then m; Q6_K's int8 scale of values 0-15,
      then of values 16-31;
    `planes` 32-byte planes of high bits (q5_x, Q5_K: bit 4; Q6_K: bit 4, then bit 5): byte 4r + k,
      bit 2c + s, is that bit of row r's value 4c + k + 16s;
    the nibbles, as q4_0's chunks: 4 chunks of 32 bytes, chunk c holding bytes 4c..4c+3 of rows
      0..7 in turn, where a row's byte j is value j's low 4 bits and value j + 16's above them.
Every bit of the values is kept, and the scales as they are (Q4_K's 6-bit ones widened to bytes),
so `unpack` gives back the file's integers exactly.
"""

from __future__ import annotations

import torch

from kernels.gguf_kquants import Decoded

GROUP_ROWS = 8
K_QUANTS = ("q4_k", "q5_k", "q6_k")
PLANES = {"q5_0": 1, "q5_1": 1, "q4_k": 0, "q5_k": 1, "q6_k": 2}


def super_header_halves(name: str) -> int:
    """fp16 values per row in a group-superblock's header: d, and q5_1's m or Q4_K/Q5_K's dmin."""
    return 2 if name in ("q5_1", "q4_k", "q5_k") else 1


def sub_bytes(name: str) -> int:
    return (16 if name in K_QUANTS else 0) + 32 * PLANES[name] + 128


def group_bytes(name: str, in_features: int) -> int:
    """Bytes of one group of 8 rows."""
    per_super = values_per_super(name)
    supers = in_features // per_super
    return supers * (16 * super_header_halves(name) + per_super // 32 * sub_bytes(name))


def values_per_super(name: str) -> int:
    """Values per super-block: 256 for the K-quants, one block of 32 for q5_x."""
    return 256 if name in K_QUANTS else 32


def repack(dec: Decoded, name: str) -> torch.Tensor:
    """Decoded rows -> groups of 8 rows [ceil(rows / 8), group bytes] (zero rows pad the last)."""
    rows = dec.values.shape[0]
    pad = -rows % GROUP_ROWS
    dec = _padded(dec, pad)
    g = (rows + pad) // GROUP_ROWS
    u = dec.values.reshape(g, GROUP_ROWS, *dec.values.shape[1:])  # [G, r, S, J, 32]
    supers, subs = u.shape[2], u.shape[3]
    nib = (u[..., :16] & 0x0F) | ((u[..., 16:] & 0x0F) << 4)  # [G, r, S, J, 16]
    chunks = nib.reshape(g, GROUP_ROWS, supers, subs, 4, 4).permute(0, 2, 3, 4, 1, 5).reshape(g, supers, subs, 128)
    fields = []
    if name in K_QUANTS:
        assert dec.scales is not None
        scales = dec.scales.reshape(g, GROUP_ROWS, supers, subs, 2).permute(0, 2, 3, 4, 1)  # [G, S, J, 2, r]
        fields.append(scales.contiguous().view(torch.uint8).reshape(g, supers, subs, 16))
    for plane in range(PLANES[name]):
        bits = ((u >> (4 + plane)) & 1).reshape(g, GROUP_ROWS, supers, subs, 2, 4, 4)  # [G, r, S, J, s, c, k]
        lanes = bits.permute(0, 2, 3, 1, 6, 5, 4).reshape(g, supers, subs, 32, 8)  # bit 2c + s of lane 4r + k
        fields.append((lanes.to(torch.int32) << torch.arange(8, dtype=torch.int32)).sum(-1).to(torch.uint8))
    fields.append(chunks)
    body = torch.cat(fields, dim=-1).reshape(g, supers, -1)
    halves = [dec.d] + ([dec.d2] if super_header_halves(name) == 2 and dec.d2 is not None else [])
    header = [h.reshape(g, GROUP_ROWS, supers).transpose(1, 2).contiguous().view(torch.uint8).reshape(g, supers, 16)
              for h in halves]
    return torch.cat([*header, body], dim=-1).reshape(g, -1).contiguous()


def unpack(grouped: torch.Tensor, name: str, rows: int) -> Decoded:
    """The inverse of `repack`: the first `rows` rows' integers."""
    g = grouped.shape[0]
    nhalves = super_header_halves(name)
    subs = values_per_super(name) // 32
    sb = sub_bytes(name)
    per_super = 16 * nhalves + subs * sb
    supers = grouped.shape[1] // per_super
    s = grouped.reshape(g, supers, per_super)
    halves = [s[..., 16 * i: 16 * (i + 1)].contiguous().view(torch.float16).reshape(g, supers, GROUP_ROWS)
              .transpose(1, 2).reshape(g * GROUP_ROWS, supers) for i in range(nhalves)]
    body = s[..., 16 * nhalves:].reshape(g, supers, subs, sb)
    at = 0
    scales = None
    if name in K_QUANTS:
        raw = body[..., :16].reshape(g, supers, subs, 2, GROUP_ROWS).permute(0, 4, 1, 2, 3)  # [G, r, S, J, 2]
        if name == "q6_k":
            raw = raw.contiguous().view(torch.int8)
        scales = raw.reshape(g * GROUP_ROWS, supers, subs, 2)
        at = 16
    planes = []
    for _ in range(PLANES[name]):
        lanes = body[..., at: at + 32]  # [G, S, J, 32 lanes]
        bits = (lanes[..., None] >> torch.arange(8, dtype=torch.uint8)) & 1  # [G, S, J, (r, k), (c, s)]
        planes.append(bits.reshape(g, supers, subs, GROUP_ROWS, 4, 4, 2).permute(0, 3, 1, 2, 6, 5, 4))
        at += 32
    chunks = body[..., at:].reshape(g, supers, subs, 4, GROUP_ROWS, 4).permute(0, 4, 1, 2, 3, 5)
    nib = chunks.reshape(g, GROUP_ROWS, supers, subs, 16)
    u = torch.cat([nib & 0x0F, nib >> 4], dim=-1)  # [G, r, S, J, 32]
    for i, bits in enumerate(planes):  # [G, r, S, J, s, c, k] -> value 16s + 4c + k
        u = u | (bits.reshape(g, GROUP_ROWS, supers, subs, 32) << (4 + i))
    u = u.reshape(g * GROUP_ROWS, supers, subs, 32)
    d2 = halves[1][:rows] if nhalves == 2 else None
    return Decoded(u[:rows].contiguous(), halves[0][:rows].contiguous(), d2,
                   None if scales is None else scales[:rows].contiguous())


def _padded(dec: Decoded, pad: int) -> Decoded:
    if not pad:
        return dec

    def grow(t: torch.Tensor | None) -> torch.Tensor | None:
        return None if t is None else torch.cat([t, t.new_zeros(pad, *t.shape[1:])])

    values, d = grow(dec.values), grow(dec.d)
    assert values is not None and d is not None
    return Decoded(values, d, grow(dec.d2), grow(dec.scales))
