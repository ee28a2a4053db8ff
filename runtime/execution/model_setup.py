"""Build everything the model runner owns, in the process that owns the device (the scheduler,
and each tensor-parallel rank): the weights, the KV pool sized for them, the request table and
the attention backend, with the CPU ops' engines chosen (`runtime.execution.engines`). The config
comes resolved (`runtime.execution.resolve`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from kernels.base import AttentionBackend
from kernels.fused_ops import CpuFusedOps
from kernels.kv_pool import KVPool, ReqToTokenPool
from kernels.sampling import TruncatedSampler
from runtime.contracts.config import ServerConfig, read_model_json
from runtime.contracts.model_config import ModelConfig
from runtime.execution.backends import make_backend
from runtime.execution.device import DTYPES, prepare_torch, rank_device
from runtime.execution.engines import Choice, choose_engines
from runtime.models.base import CausalLM

if TYPE_CHECKING:
    from runtime.parallel.group import TensorParallel

CUDA_DEFAULT_MAX_RUNNING = 1024


@dataclass
class LoadedModel:
    """The model and its device memory, ready for a ModelRunner."""

    config: ServerConfig  # resolved, with the final KV capacity
    model_config: ModelConfig
    model: CausalLM
    device: torch.device
    dtype: torch.dtype
    page_size: int
    kv_pool: KVPool
    req_to_token: ReqToTokenPool
    backend: AttentionBackend
    tp: TensorParallel | None = None  # this rank's part and the group, under tensor parallelism
    sampler: TruncatedSampler | None = None  # the device's sort-free top-k/top-p draws (FlashInfer)
    engines: list[Choice] = field(default_factory=list)  # the CPU ops' engines (runtime/execution/engines.py)

    @property
    def max_total_tokens(self) -> int:
        """Usable KV slots (slot 0 / page 0 is padding)."""
        return self.kv_pool.num_slots - self.page_size


def load_model_for_serving(config: ServerConfig, tp: TensorParallel | None = None) -> LoadedModel:
    """Load weights, size and allocate the KV pool, and build the attention backend (with `tp`:
    this rank's part of the model, its KV heads, and the KV capacity every rank can hold)."""
    from runtime.execution.weights import load_model

    assert config.model_path and config.device != "auto", "resolve_config() first"
    prepare_torch(config)
    model_config = ModelConfig.from_hf(read_model_json(config.model_path, "config.json"))
    device = rank_device(config.device, tp.plan.rank if tp else 0)
    dtype = DTYPES[config.dtype]
    model = load_model(
        config.model_path, model_config, dtype, device, load_format=config.load_format, seed=config.random_seed,
        quantization=config.quantization, tp=tp, gguf_file=config.gguf_file,
    )
    local = model.config  # this rank's heads
    if device.type == "cpu" and dtype in (torch.float32, torch.bfloat16):  # the kernels' dtypes
        from runtime.execution.cpu_kernels import load_cpu_kernels

        ext = load_cpu_kernels()
        model.use_fused_ops(CpuFusedOps(ext) if ext is not None else None)
        model.model.use_decode_stack(ext)
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
    sampler = use_flashinfer_kernels(model) if config.attention_backend == "flashinfer" else None
    engines = choose_engines(model, backend, config) if device.type == "cpu" else []
    resolved = config.replace(max_total_tokens=num_slots - ps, max_running_requests=max_running)
    return LoadedModel(resolved, model_config, model, device, dtype, ps, kv_pool, req_to_token, backend, tp, sampler,
                       engines)


def _cuda_kv_tokens(config: ServerConfig, mc: ModelConfig, kv_dtype: torch.dtype) -> int:
    """KV capacity from free GPU memory after the weights are loaded."""
    free, total = torch.cuda.mem_get_info()
    budget = free - total * (1 - config.mem_fraction_static)
    per_token = KVPool.bytes_per_token(mc.num_layers, mc.num_kv_heads, mc.head_dim, kv_dtype)
    tokens = int(budget // per_token)
    if tokens <= 0:
        raise RuntimeError(f"no GPU memory left for the KV cache (free {free / 2**30:.1f} GiB)")
    return tokens


def use_flashinfer_kernels(model: CausalLM) -> TruncatedSampler:
    """With FlashInfer's attention, its other kernels too: the fused norm, activation and rotary
    in the model, and the sort-free top-k/top-p sampler (returned, for the runner)."""
    from kernels.flashinfer_ops import FlashInferFusedOps
    from kernels.flashinfer_sampling import FlashInferTruncatedSampler
    from kernels.flashinfer_support import import_flashinfer

    flashinfer = import_flashinfer()
    model.use_fused_ops(FlashInferFusedOps(flashinfer, model.model.rotary))
    return FlashInferTruncatedSampler(flashinfer)
