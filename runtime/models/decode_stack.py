"""A decode step's decoder layers, one C++ call each (kernels/csrc/decode_layer.cpp).

At one decode row the Python around a layer's kernels (module calls, views, the KV write) cost
about as much as the kernels themselves on the Q4_1 default model; `decode_layer` runs the same
kernels in the same order from C++, so the hidden states are the Python path's bit for bit.

It applies when every linear of every layer runs on GGUF blocks through our kernel (the default
CPU model, `--load-format gguf`, `--quantization q8_0|q4_0|q4_1`), on one rank, without Qwen3's
q/k norms; and per step when the backend says the batch is a decode batch that its C++ decode
kernel attends without a shared-prefix split (`AttentionBackend.decode_kernel_inputs`) and the
KV pool holds the activations' dtype. Anything else runs the layers in Python.
"""

from __future__ import annotations

from collections.abc import Sequence
from types import ModuleType
from typing import Protocol

import torch

from kernels.base import DecodeKernelInputs
from kernels.linear import Linear
from kernels.quant_linear import BlockQuantLinearMethod


# What the stack reads of a DecoderLayer (runtime/models/base.py, which imports this module).
class _Norm(Protocol):
    @property
    def weight(self) -> torch.Tensor: ...
    @property
    def eps(self) -> float: ...


class _Attention(Protocol):
    @property
    def qkv_proj(self) -> Linear: ...
    @property
    def o_proj(self) -> Linear: ...
    @property
    def qk_norm(self) -> bool: ...
    @property
    def num_heads(self) -> int: ...
    @property
    def head_dim(self) -> int: ...


class _MLP(Protocol):
    @property
    def gate_up_proj(self) -> Linear: ...
    @property
    def down_proj(self) -> Linear: ...


class Layer(Protocol):
    @property
    def input_layernorm(self) -> _Norm: ...
    @property
    def post_attention_layernorm(self) -> _Norm: ...
    @property
    def self_attn(self) -> _Attention: ...
    @property
    def mlp(self) -> _MLP: ...


LayerArgs = tuple[list[torch.Tensor], list[torch.Tensor], list[int], list[int], list[torch.Tensor]]
NO_BIAS = torch.empty(0)


class DecodeStack:
    """The per-layer weights `decode_layer` takes, gathered once after loading."""

    def __init__(self, ext: ModuleType, layers: list[LayerArgs], eps: float, isa: int, num_heads: int,
                 scale: float) -> None:
        self.ext = ext
        self.layers = layers
        self.eps, self.isa, self.num_heads, self.scale = eps, isa, num_heads, scale

    @classmethod
    def build(cls, layers: Sequence[Layer], ranks: int, ext: ModuleType | None) -> DecodeStack | None:
        """The stack for a decoder's layers on `ranks` ranks, or None when a layer cannot run as one call."""
        if ext is None or not hasattr(ext, "decode_layer") or ranks != 1 or not layers:
            return None
        args: list[LayerArgs] = []
        isas: set[int] = set()
        for layer in layers:
            one = _layer_args(layer, isas)
            if one is None:
                return None
            args.append(one)
        eps = {layer.input_layernorm.eps for layer in layers}
        if len(isas) != 1 or len(eps) != 1:
            return None
        attn = layers[0].self_attn
        return cls(ext, args, eps.pop(), isas.pop(), attn.num_heads, attn.head_dim**-0.5)

    def run(self, h: torch.Tensor, table: torch.Tensor, inputs: DecodeKernelInputs
            ) -> tuple[torch.Tensor, torch.Tensor | None] | None:
        """(h, residual) after every layer, as DecoderModel's loop gives them; None (nothing run)
        when the pool's dtype is not the activations'."""
        if inputs.k_pools[0].dtype != h.dtype:
            return None
        residual: torch.Tensor | None = None
        for i, (norms, blocks, formats, out_features, biases) in enumerate(self.layers):
            h, residual = self.ext.decode_layer(
                h, residual, norms, self.eps, blocks, formats, out_features, biases, self.isa, table,
                self.num_heads, inputs.k_pools[i], inputs.v_pools[i], inputs.out_loc, inputs.slots, inputs.indptr,
                self.scale)
        return h, residual


def _layer_args(layer: Layer, isas: set[int]) -> LayerArgs | None:
    attn, mlp = layer.self_attn, layer.mlp
    if attn.qk_norm or layer.input_layernorm.eps != layer.post_attention_layernorm.eps:
        return None
    linears: list[Linear] = [attn.qkv_proj, attn.o_proj, mlp.gate_up_proj, mlp.down_proj]
    methods = [linear.method for linear in linears]
    if not all(isinstance(m, BlockQuantLinearMethod) and m.kernels is not None for m in methods):
        return None
    blocks, formats, out_features = [], [], []
    for method in methods:
        assert isinstance(method, BlockQuantLinearMethod)
        blocks.append(method.grouped)
        formats.append(method.fmt.code)
        out_features.append(method.out_features)
        isas.add(method.isa_code)
    biases = [NO_BIAS if linear.bias is None else linear.bias.detach() for linear in linears]
    norms = [layer.input_layernorm.weight.detach(), layer.post_attention_layernorm.weight.detach()]
    return norms, blocks, formats, out_features, biases
