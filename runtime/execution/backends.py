"""The attention backend registry: the factories import lazily, so a CPU machine never imports
flashinfer."""

from __future__ import annotations

import logging

import torch

from kernels.base import AttentionBackend, AttentionOptions
from kernels.kv_pool import KVPool
from kernels.sliding_window import PerLayerBackend
from runtime.contracts.model_config import ModelConfig

logger = logging.getLogger(__name__)


def make_backend(name: str, kv_pool: KVPool, mc: ModelConfig, dtype: torch.dtype,
                 workspace_bytes: int | None = None) -> AttentionBackend:
    """The attention backend for the model's layers: one per distinct sliding window (one for most
    models), behind a `PerLayerBackend` when the layers differ. `workspace_bytes`: FlashInfer's
    workspace (default: flashinfer_support.WORKSPACE_BYTES; tests pass a small one)."""
    if name not in ("torch", "flashinfer"):
        raise ValueError(f"unknown attention backend {name!r}; known: torch, flashinfer")
    if mc.attn_softcap is not None and name == "torch":
        logger.info("attention logit soft-capping (%s): attention runs on the torch paths, not our C++ kernels",
                    mc.attn_softcap)
    windows = mc.layer_windows or (None,)
    backends = {w: _make_one(name, kv_pool, mc, dtype, AttentionOptions(mc.attn_scale, mc.attn_softcap, w),
                             workspace_bytes) for w in dict.fromkeys(windows)}
    if len(backends) == 1:
        return next(iter(backends.values()))
    return PerLayerBackend(backends, windows)


def _make_one(name: str, kv_pool: KVPool, mc: ModelConfig, dtype: torch.dtype, options: AttentionOptions,
              workspace_bytes: int | None) -> AttentionBackend:
    """The registry: factories import lazily so CPU machines never import flashinfer."""
    if name == "torch":
        from kernels.torch_backend import TorchAttentionBackend
        from runtime.execution.cpu_kernels import load_cpu_kernels

        kernels = load_cpu_kernels() if kv_pool.device.type == "cpu" else None
        return TorchAttentionBackend(kv_pool, mc.num_heads, mc.num_kv_heads, mc.head_dim, kernels, options=options)
    from kernels.flashinfer_backend import FlashInferAttentionBackend
    from kernels.flashinfer_support import WORKSPACE_BYTES

    return FlashInferAttentionBackend(kv_pool, mc.num_heads, mc.num_kv_heads, mc.head_dim, dtype,
                                      workspace_bytes or WORKSPACE_BYTES, options)
