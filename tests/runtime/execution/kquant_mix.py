"""A K-quant mix of the default model written as a .gguf file, as llama-quantize's _M files mix
formats, for the tests that run one from its blocks without llama.cpp.

The embedded Q4_1 file's weights are decoded (by gguf-py) and quantized again, layer by layer:
  ffn_down (1536 columns, whole 256-value super-blocks): Q4_K, Q5_K, Q6_K in turn;
  attn_v: q8_0 in even layers (beside q5_0 q and k: a fused q/k/v of two formats), q5_0 in odd;
  the other linears: q5_0 in even layers, q5_1 in odd;
  the token embedding (q8_0, the tied head's too) and the norms as they are.
gguf-py quantizes q5_0, q5_1 and q8_0; it has no K-quant quantizer, so `quantize_k` below is a
plain one of our own (per sub-block a min/max scale, 6-bit scales against the super-block's
fp16 d): good enough to test with, not llama-quantize's error-minimizing search.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from gguf import GGMLQuantizationType, GGUFReader, GGUFValueType, GGUFWriter, quants

from kernels import gguf_kquants

K_TYPES = [GGMLQuantizationType.Q4_K, GGMLQuantizationType.Q5_K, GGMLQuantizationType.Q6_K]
K_NAMES = {GGMLQuantizationType.Q4_K: "q4_k", GGMLQuantizationType.Q5_K: "q5_k", GGMLQuantizationType.Q6_K: "q6_k"}


def quantize_k(weight: torch.Tensor, name: str) -> torch.Tensor:
    """`weight` [rows, k] (k a multiple of 256) as rows of `name` blocks."""
    rows = weight.shape[0]
    if name == "q6_k":
        x = weight.double().reshape(rows, -1, 16, 16)
        scale = x.abs().amax(-1) / 31
        d = (scale.amax(-1) / 127).half()
        sc = torch.round(scale / torch.where(d == 0, 1, d.double())[..., None]).clamp(-128, 127)
        step = (d.double()[..., None] * sc)[..., None]
        u = (torch.round(x / torch.where(step == 0, 1, step)) + 32).clamp(0, 63)
        return gguf_kquants.encode(gguf_kquants.Decoded(u.reshape(rows, -1, 8, 32).to(torch.uint8), d, None,
                                                        sc.to(torch.int8).reshape(rows, -1, 8, 2)), name)
    top = 15 if name == "q4_k" else 31
    x = weight.double().reshape(rows, -1, 8, 32)
    low = x.amin(-1).clamp(max=0)
    scale, minimum = (x.amax(-1) - low) / top, -low
    d, dmin = (scale.amax(-1) / 63).half(), (minimum.amax(-1) / 63).half()
    sc = torch.round(scale / torch.where(d == 0, 1, d.double())[..., None]).clamp(0, 63)
    m = torch.round(minimum / torch.where(dmin == 0, 1, dmin.double())[..., None]).clamp(0, 63)
    step = (d.double()[..., None] * sc)[..., None]
    shifted = x + (dmin.double()[..., None] * m)[..., None]
    u = torch.round(shifted / torch.where(step == 0, 1, step)).clamp(0, top)
    return gguf_kquants.encode(gguf_kquants.Decoded(u.to(torch.uint8), d, dmin,
                                                    torch.stack([sc, m], -1).to(torch.uint8)), name)


def target_type(tensor_name: str) -> GGMLQuantizationType | None:
    """The mix's format for a linear's weight (None: keep the tensor as it is)."""
    parts = tensor_name.split(".")
    if parts[0] != "blk" or parts[-1] != "weight" or "norm" in parts[2]:
        return None
    layer, kind = int(parts[1]), parts[2]
    if kind == "ffn_down":
        return K_TYPES[layer % 3]
    if kind == "attn_v":
        return GGMLQuantizationType.Q8_0 if layer % 2 == 0 else GGMLQuantizationType.Q5_0
    return GGMLQuantizationType.Q5_0 if layer % 2 == 0 else GGMLQuantizationType.Q5_1


def write_kquant_mix(source: Path, out: Path) -> Path:
    """The model in `source` (a .gguf file) requantized as the mix above, at `out`."""
    reader = GGUFReader(source)
    arch = reader.fields["general.architecture"].contents()
    writer = GGUFWriter(out, arch)
    for name, field in reader.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue
        vtype = field.types[0]
        sub = field.types[-1] if vtype == GGUFValueType.ARRAY else None
        writer.add_key_value(name, field.contents(), vtype, sub)
    for tensor in reader.tensors:
        kind = target_type(tensor.name)
        if kind is None:
            writer.add_tensor(tensor.name, np.array(tensor.data), raw_dtype=tensor.tensor_type)
            continue
        weight = quants.dequantize(np.array(tensor.data), tensor.tensor_type).astype(np.float32)
        if kind in K_NAMES:
            blocks = quantize_k(torch.from_numpy(weight), K_NAMES[kind]).numpy()
        else:
            blocks = quants.quantize(weight, kind)
        writer.add_tensor(tensor.name, blocks, raw_dtype=kind)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out
