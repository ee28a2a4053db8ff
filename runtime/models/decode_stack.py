"""A decode step's decoder layers, one C++ call each (kernels/csrc/decode_layer.cpp).

At one decode row the Python around a layer's kernels (module calls, views, the KV write) cost
about as much as the kernels themselves on the Q4_1 default model; `decode_layer` runs the same
kernels in the same order from C++, so the hidden states are the Python path's bit for bit.

It applies when every linear of every layer runs on GGUF blocks through our kernel (the default
CPU model, `--load-format gguf`, `--quantization q8_0|q4_0|q4_1`), a fused one part by part where
its parts differ in format, on one rank, without Qwen3's
q/k norms; and per step when the backend says the batch is a decode batch that its C++ decode
kernels attend (`AttentionBackend.decode_kernel_inputs`; a prefix every row shares is attended
once, cascade_attention.cpp) and the KV pool holds the activations' dtype. Anything else runs the layers in Python.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from types import ModuleType

import torch

from kernels.base import DecodeKernelInputs
from kernels.linear import Linear
from kernels.quant_linear import BlockQuantLinearMethod, block_parts

NO_BIAS = torch.empty(0)


@dataclass(frozen=True)
class BlockLayer:
    """One decoder layer's weights as decode_layer takes them (DecoderLayer.block_layer gives it)."""

    norms: list[torch.Tensor]  # the input and post-attention RMSNorm weights
    eps: float
    # Of qkv, o, gate_up and down, in that order, part by part (biases: NO_BIAS for none).
    blocks: list[torch.Tensor]
    formats: list[int]
    out_features: list[int]
    biases: list[torch.Tensor]
    parts: list[int]  # each linear's count of parts (BlockPartsLinearMethod: several)
    isa: int

    @classmethod
    def of(cls, norms: list[torch.Tensor], eps: float, linears: list[Linear]) -> BlockLayer | None:
        """None unless every linear runs on GGUF blocks through our kernel, in one ISA variant."""
        per_linear = [_block_parts(linear) for linear in linears]
        flat = [part for parts in per_linear if parts is not None for part in parts]
        if any(parts is None for parts in per_linear) or len({m.isa_code for m, _ in flat}) != 1:
            return None
        return cls([w.detach() for w in norms], eps, [m.grouped for m, _ in flat], [m.fmt.code for m, _ in flat],
                   [m.out_features for m, _ in flat], [bias for _, bias in flat],
                   [len(parts) for parts in per_linear if parts is not None], flat[0][0].isa_code)


def _block_parts(linear: Linear) -> list[tuple[BlockQuantLinearMethod, torch.Tensor]] | None:
    """The (block method, bias) parts `linear` computes with, or None if one is not our kernel's."""
    parts = block_parts(linear.method)
    if not parts or any(m.kernels is None for m in parts):
        return None
    if linear.bias is None:
        return [(m, NO_BIAS) for m in parts]
    return list(zip(parts, linear.bias.detach().split([m.out_features for m in parts]), strict=True))


class DecodeStack:
    """The layers' weights `decode_layer` takes, gathered once after loading."""

    def __init__(self, ext: ModuleType, layers: list[BlockLayer], num_heads: int, scale: float) -> None:
        self.ext = ext
        self.layers = layers
        self.num_heads, self.scale = num_heads, scale

    @classmethod
    def build(cls, layers: Sequence[BlockLayer | None], ranks: int, num_heads: int, head_dim: int,
              ext: ModuleType | None) -> DecodeStack | None:
        """The stack for a decoder's layers on `ranks` ranks, or None when a layer cannot run as one call."""
        if ext is None or not hasattr(ext, "decode_layer") or ranks != 1 or not layers:
            return None
        ready = [layer for layer in layers if layer is not None]
        if len(ready) != len(layers) or len({layer.isa for layer in ready}) != 1:
            return None
        return cls(ext, ready, num_heads, head_dim**-0.5)

    def run(self, h: torch.Tensor, table: torch.Tensor, inputs: DecodeKernelInputs
            ) -> tuple[torch.Tensor, torch.Tensor | None] | None:
        """(h, residual) after every layer, as DecoderModel's loop gives them; None (nothing run)
        when the pool's dtype is not the activations'."""
        if inputs.k_pools[0].dtype != h.dtype:
            return None
        residual: torch.Tensor | None = None
        for i, layer in enumerate(self.layers):
            h, residual = self.ext.decode_layer(
                h, residual, layer.norms, layer.eps, layer.blocks, layer.formats, layer.out_features, layer.biases,
                layer.isa, table, self.num_heads, inputs.k_pools[i], inputs.v_pools[i], inputs.out_loc,
                inputs.slots, inputs.indptr, self.scale, inputs.shared_slots, layer.parts)
        return h, residual
