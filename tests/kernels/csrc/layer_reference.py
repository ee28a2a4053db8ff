"""A decoder layer's decode step composed in float64 from its parts (RMSNorm, GGUF-block linears
decoded by gguf, rotary, softmax attention, SiLU * up): the reference for
kernels/csrc/decode_layer.cpp, optionally with each linear's input rounded to the kernel's 8-bit
activation blocks (the numpy rule of block_reference.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from tests.kernels.csrc.attention_reference import attend, spans
from tests.kernels.csrc.block_reference import quantize_activations

NAMES = ("qkv", "o", "gate_up", "down")


def rotary_table(positions: torch.Tensor, dim: int, dtype: torch.dtype) -> torch.Tensor:
    """[T, 2 * dim]: cos, cos, -sin, sin of each position's angles (theta 10000), in `dtype`."""
    inv = 10000.0 ** (-torch.arange(0, dim, 2, dtype=torch.float64) / dim)
    angles = positions.double()[:, None] * inv[None, :]
    return torch.cat([angles.cos(), angles.cos(), -angles.sin(), angles.sin()], dim=-1).to(dtype)


def rotate(x: np.ndarray, table: np.ndarray) -> np.ndarray:
    """x [T, heads, D] rotated by table [T, 2D] (rotate_half; the sign is in the table)."""
    dim = x.shape[-1]
    cos, sin = table[:, None, :dim], table[:, None, dim:]
    half = dim // 2
    return x * cos + np.concatenate([x[..., half:], x[..., :half]], axis=-1) * sin


def rms_norm(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    return x / np.sqrt((x * x).mean(axis=-1, keepdims=True) + eps) * weight


@dataclass
class LayerWeights:
    """A layer's weights as float64 (what the kernel's blocks decode to) and its geometry."""

    norms: tuple[np.ndarray, np.ndarray]
    linears: dict[str, np.ndarray]  # NAMES -> [out, in]
    qkv_bias: np.ndarray
    heads: int
    kv_heads: int
    head_dim: int
    eps: float


def decode_step(w: LayerWeights, h: np.ndarray, residual: np.ndarray | None, table: np.ndarray,
                k_pool: np.ndarray, v_pool: np.ndarray, out_loc: list[int], rows: list[list[int]],
                quantized: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(output, residual stream, k_pool, v_pool after the write) of one decode step over rows b's
    slots rows[b] (its new token's slot out_loc[b] last). `quantized`: each linear meets its
    input's 8-bit blocks, as the kernel does."""

    def linear(name: str, x: np.ndarray) -> np.ndarray:
        xin = quantize_activations(x.astype(np.float32)).dequantized() if quantized else x
        return xin @ w.linears[name].T

    stream = h if residual is None else h + residual
    qkv = linear("qkv", rms_norm(stream, w.norms[0], w.eps)) + w.qkv_bias
    batch, d = h.shape[0], w.head_dim
    q = rotate(qkv[:, : w.heads * d].reshape(batch, w.heads, d), table)
    k = rotate(qkv[:, w.heads * d : (w.heads + w.kv_heads) * d].reshape(batch, w.kv_heads, d), table)
    k_pool, v_pool = k_pool.copy(), v_pool.copy()
    k_pool[out_loc] = k
    v_pool[out_loc] = qkv[:, (w.heads + w.kv_heads) * d :].reshape(batch, w.kv_heads, d)
    keys = [s for row in rows for s in row]
    starts = np.cumsum([0, *[len(r) for r in rows[:-1]]]).tolist()
    visible = spans(starts, [len(r) for r in rows], len(keys))
    attn = attend(torch.from_numpy(q), torch.from_numpy(k_pool[keys]), torch.from_numpy(v_pool[keys]), d**-0.5,
                  visible).out.numpy()
    stream = stream + linear("o", attn.reshape(batch, -1))
    gate, up = np.split(linear("gate_up", rms_norm(stream, w.norms[1], w.eps)), 2, axis=-1)
    out = linear("down", gate / (1 + np.exp(-gate)) * up)
    return out, stream, k_pool, v_pool
