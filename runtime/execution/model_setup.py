"""Resolve a config's "auto" values and build everything the model runner owns.

`resolve_config` runs once per launch (in the main process) and returns a new frozen config with
the model path, device, dtype, attention backend, chunk size and KV capacity made concrete.
`load_model_for_serving` runs in the process that owns the device (the scheduler).
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from kernels.base import AttentionBackend
from runtime.contracts.config import ServerConfig, read_model_json
from runtime.execution.device import (
    DTYPES, dtype_name, rank_device, resolve_attention_backend, resolve_device, resolve_dtype, threads_per_rank,
)
from runtime.contracts.errors import InvalidRequest
from runtime.execution.gguf_model import is_gguf_path
from kernels.kv_pool import KVPool, ReqToTokenPool
from runtime.contracts.model_config import ModelConfig
from runtime.parallel.sharding import check_shardable

if TYPE_CHECKING:
    from runtime.parallel.group import TensorParallel

logger = logging.getLogger("radixserve.setup")

CPU_DEFAULT_KV_TOKENS = 65536
CPU_DEFAULT_MAX_RUNNING = 256
CUDA_DEFAULT_MAX_RUNNING = 1024
CPU_DEFAULT_CHUNK = 512
CUDA_DEFAULT_CHUNK = 2048


def resolve_config(config: ServerConfig) -> ServerConfig:
    """Turn every "auto"/None default into a concrete value (a new frozen config)."""
    model_path = config.model_path
    served_name = config.served_model_name
    load_format = config.load_format
    if model_path is None:
        from runtime.support.default_model import ensure_default_model

        model_path = ensure_default_model()
    elif load_format == "gguf" or is_gguf_path(model_path):
        from runtime.execution.gguf_model import ensure_gguf_folder

        served_name = served_name or os.path.basename(model_path).removesuffix(".gguf")
        model_path, load_format = ensure_gguf_folder(model_path), "auto"
    model_config = ModelConfig.from_hf(read_model_json(model_path, "config.json"))
    device = resolve_device(config.device)
    check_tp(config.tp_size, model_config, device)
    dtype, why = resolve_dtype(config.dtype, model_config.torch_dtype, device)
    kv_dtype = dtype if config.kv_cache_dtype == "auto" else DTYPES[config.kv_cache_dtype]
    logger.info("dtype %s, KV cache %s (%s)", dtype_name(dtype), dtype_name(kv_dtype), why)
    backend, backend_why = resolve_attention_backend(
        config.attention_backend, device, dtype_name(dtype), dtype_name(kv_dtype))
    logger.info("attention backend %s (%s)", backend, backend_why)
    chunk = config.chunked_prefill_size
    if chunk is None:
        chunk = CUDA_DEFAULT_CHUNK if device.type == "cuda" else CPU_DEFAULT_CHUNK
    context = config.context_length or model_config.max_position_embeddings
    if context > model_config.max_position_embeddings:
        raise InvalidRequest(
            f"context_length {context} exceeds the model's max_position_embeddings "
            f"{model_config.max_position_embeddings}",
            param="context_length",
        )
    max_total = config.max_total_tokens
    if max_total is None and device.type == "cpu":
        max_total = CPU_DEFAULT_KV_TOKENS
    max_running = config.max_running_requests
    if max_running is None and device.type == "cpu":
        max_running = CPU_DEFAULT_MAX_RUNNING
    graph_max_bs = config.cuda_graph_max_bs
    if graph_max_bs is None and device.type == "cuda":
        from runtime.execution.cuda_graph import default_max_bs

        graph_max_bs = default_max_bs(torch.cuda.get_device_properties(device).total_memory / 2**30)
    return config.replace(
        model_path=model_path,
        load_format=load_format,
        served_model_name=served_name,
        tokenizer_path=config.tokenizer_path or model_path,
        device=device.type,
        dtype=dtype_name(dtype),
        kv_cache_dtype=dtype_name(kv_dtype),
        attention_backend=backend,
        cuda_graph_max_bs=graph_max_bs,
        # Graphs capture FlashInfer's graph wrappers; the torch backend runs eagerly. Graphs with
        # NCCL collectives inside are not built yet: tensor-parallel decode runs eagerly.
        disable_cuda_graph=(
            config.disable_cuda_graph or device.type != "cuda" or backend != "flashinfer" or config.tp_size > 1
        ),
        chunked_prefill_size=chunk,
        context_length=context,
        max_total_tokens=max_total,
        max_running_requests=max_running,
        enable_mixed_chunk=device.type == "cpu" if config.enable_mixed_chunk is None else config.enable_mixed_chunk,
        # Speculative steps need the previous step's accepted tokens to draft the next: no overlap.
        disable_overlap_schedule=config.speculative_algorithm != "none" or (
            device.type != "cuda" if config.disable_overlap_schedule is None else config.disable_overlap_schedule
        ),
    )


def check_tp(tp_size: int, model_config: ModelConfig, device: torch.device) -> None:
    """Refuse, naming tp_size, a split the model or the machine cannot take."""
    check_shardable(model_config, tp_size)
    if device.type == "cuda" and tp_size > torch.cuda.device_count():
        raise InvalidRequest(
            f"tp_size {tp_size} needs {tp_size} GPUs; {torch.cuda.device_count()} are visible", param="tp_size"
        )


@dataclass
class LoadedModel:
    """The model and its device memory, ready for a ModelRunner."""

    config: ServerConfig  # resolved, with the final KV capacity
    model_config: ModelConfig
    model: torch.nn.Module
    device: torch.device
    dtype: torch.dtype
    page_size: int
    kv_pool: KVPool
    req_to_token: ReqToTokenPool
    backend: AttentionBackend
    tp: TensorParallel | None = None  # this rank's part and the group, under tensor parallelism

    @property
    def max_total_tokens(self) -> int:
        """Usable KV slots (slot 0 / page 0 is padding)."""
        return self.kv_pool.num_slots - self.page_size


def load_model_for_serving(config: ServerConfig, tp: TensorParallel | None = None) -> LoadedModel:
    """Load weights, size and allocate the KV pool, and build the attention backend (with `tp`:
    this rank's part of the model, its KV heads, and the KV capacity every rank can hold)."""
    from runtime.execution.weights import load_model

    assert config.model_path and config.device != "auto", "resolve_config() first"
    torch.manual_seed(config.random_seed)
    threads = threads_per_rank(config)
    if threads:
        torch.set_num_threads(threads)
    model_config = ModelConfig.from_hf(read_model_json(config.model_path, "config.json"))
    device = rank_device(config.device, tp.plan.rank if tp else 0)
    dtype = DTYPES[config.dtype]
    model = load_model(
        config.model_path, model_config, dtype, device, load_format=config.load_format, seed=config.random_seed,
        quantization=config.quantization, tp=tp,
    )
    local = model.config  # this rank's heads
    if device.type == "cpu" and dtype in (torch.float32, torch.bfloat16):  # the kernels' dtypes
        from runtime.execution.cpu_kernels import load_cpu_kernels

        model.use_cpu_kernels(load_cpu_kernels())
    kv_dtype = DTYPES[config.kv_cache_dtype]
    ps = config.page_size
    max_total = config.max_total_tokens or _cuda_kv_tokens(config, local, kv_dtype)
    if tp is not None:  # the scheduler's slot ids index every rank's pool
        max_total = tp.group.min_int(max_total)
    num_slots = (max_total // ps + 1) * ps  # + the reserved padding page
    kv_pool = KVPool(local.num_layers, num_slots, local.num_kv_heads, local.head_dim, kv_dtype, device, ps)
    assert config.context_length is not None
    max_running = config.max_running_requests or min(max(max_total // 2, 1), CUDA_DEFAULT_MAX_RUNNING)
    width = -(-config.context_length // ps) * ps
    req_to_token = ReqToTokenPool(max_running, width, device)
    backend = make_backend(config.attention_backend, kv_pool, local, dtype)
    resolved = config.replace(max_total_tokens=num_slots - ps, max_running_requests=max_running)
    return LoadedModel(resolved, model_config, model, device, dtype, ps, kv_pool, req_to_token, backend, tp)


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


def _cuda_kv_tokens(config: ServerConfig, mc: ModelConfig, kv_dtype: torch.dtype) -> int:
    """KV capacity from free GPU memory after the weights are loaded."""
    free, total = torch.cuda.mem_get_info()
    budget = free - total * (1 - config.mem_fraction_static)
    per_token = KVPool.bytes_per_token(mc.num_layers, mc.num_kv_heads, mc.head_dim, kv_dtype)
    tokens = int(budget // per_token)
    if tokens <= 0:
        raise RuntimeError(f"no GPU memory left for the KV cache (free {free / 2**30:.1f} GiB)")
    return tokens
