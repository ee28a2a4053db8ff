"""The attention backend registry: the factories import lazily, so a CPU machine never imports
flashinfer."""

from __future__ import annotations

import torch

from kernels.base import AttentionBackend
from kernels.kv_pool import KVPool
from runtime.contracts.model_config import ModelConfig


def make_backend(name: str, kv_pool: KVPool, mc: ModelConfig, dtype: torch.dtype) -> AttentionBackend:
    """The attention backend registry: factories import lazily so CPU machines never import flashinfer."""
    if name == "torch":
        from kernels.torch_backend import TorchAttentionBackend
        from runtime.execution.cpu_kernels import load_cpu_kernels

        kernels = load_cpu_kernels() if kv_pool.device.type == "cpu" else None
        return TorchAttentionBackend(kv_pool, mc.num_heads, mc.num_kv_heads, mc.head_dim, kernels)
    if name == "flashinfer":
        from kernels.flashinfer_backend import FlashInferAttentionBackend

        return FlashInferAttentionBackend(kv_pool, mc.num_heads, mc.num_kv_heads, mc.head_dim, dtype)
    raise ValueError(f"unknown attention backend {name!r}; known: torch, flashinfer")
