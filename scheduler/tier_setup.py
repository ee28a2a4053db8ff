"""Building the KV tier and the block hasher for a scheduler: the model's fingerprint, the store,
and the start-up measurements behind the load-or-recompute choice."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from typing import Any

from radix.blocks import BlockHasher
from radix.prefix_cache import BasePrefixCache
from runtime.contracts.config import ServerConfig

logger = logging.getLogger(__name__)

# What makes two processes' KV for the same tokens identical, besides the weights' bytes.
FINGERPRINT_FIELDS = ("dtype", "kv_cache_dtype", "quantization", "load_format", "tp_size", "enable_batch_variance")
SAMPLE_BYTES = 1 << 20  # read from each end of each weight file
WEIGHT_SUFFIXES = (".safetensors", ".gguf", ".bin", ".json")
MEASURE_TOKENS = 128  # the start-up prefill that seeds the prefill speed


def _weight_files(config: ServerConfig) -> list[str]:
    files = [config.gguf_file] if config.gguf_file else []
    folder = config.model_path
    if folder and os.path.isdir(folder):
        files += [os.path.join(folder, f) for f in sorted(os.listdir(folder)) if f.endswith(WEIGHT_SUFFIXES)]
    return files


def model_fingerprint(config: ServerConfig, engines: list[dict[str, str]]) -> str:
    """A name for "this model, these weights, this numeric set-up": the settings that change the
    KV, the chosen CPU engines (they may round differently), and each weight file's name, size and
    first and last megabyte (hashing whole checkpoints would cost seconds per start)."""
    h = hashlib.blake2b(digest_size=16)
    settings: dict[str, Any] = {name: getattr(config, name) for name in FINGERPRINT_FIELDS}
    if config.load_format == "dummy":
        settings["random_seed"] = config.random_seed
    h.update(json.dumps({"settings": settings, "engines": engines}, sort_keys=True, default=str).encode())
    for path in _weight_files(config):
        size = os.path.getsize(path)
        h.update(f"{os.path.basename(path)}:{size}".encode())
        with open(path, "rb") as fh:
            h.update(fh.read(SAMPLE_BYTES))
            if size > SAMPLE_BYTES:
                fh.seek(max(size - SAMPLE_BYTES, SAMPLE_BYTES))
                h.update(fh.read(SAMPLE_BYTES))
    return h.hexdigest()


def block_hasher(config: ServerConfig, runner: Any) -> BlockHasher | None:
    """The hasher when anything needs block hashes (the tier, KV events), else None."""
    if not (config.kv_tier_bytes or config.kv_events) or config.disable_radix_cache:
        return None
    return BlockHasher(config.kv_block_size, model_fingerprint(config, runner.engines))


def build_tier(config: ServerConfig, runner: Any, cache: BasePrefixCache, hasher: BlockHasher) -> Any:
    """The KV tier over `runner`'s KV pool (a `scheduler.kv_tier.KVTier`), measured and ready."""
    import torch

    from kernels.kv_pool import KVPool
    from kernels.kv_store import BlockLayout, KVStore
    from scheduler.kv_tier import KVTier
    from scheduler.tier_costs import TierCosts

    pool = runner.kv_pool
    assert isinstance(pool, KVPool), "the KV tier needs the model runner's KV pool"
    heads, head_dim = pool.k[0].shape[1:]
    layout = BlockLayout(hasher.fingerprint, hasher.block_size, len(pool.k), heads, head_dim, pool.dtype)
    store = KVStore(layout, config.kv_tier_bytes, config.kv_store)
    costs = TierCosts(layout.data_bytes // layout.block_size, _copy_bytes_per_s(torch), _prefill_tokens_per_s(runner))
    tier = KVTier(store, pool, cache, hasher, costs)
    logger.info("kv tier: %d blocks of %d tokens (%.1f MB each)%s; copy %.2f GB/s, prefill %.0f tokens/s: %s",
                store.num_slots, layout.block_size, layout.data_bytes / 1e6,
                f" in {store.path}" if store.path else " in memory", costs.copy_bytes_per_s / 1e9,
                costs.prefill_tokens_per_s, "load" if costs.load_s(1) <= costs.recompute_s(1) else "recompute")
    return tier


def _copy_bytes_per_s(torch: Any) -> float:
    """A timed host copy of 32 MB: what a load from a warm store moves (the store's own reads
    update it, cold pages on disk included)."""
    src = torch.ones(8 << 20, dtype=torch.float32)
    dst = torch.empty_like(src)
    dst.copy_(src)
    start = time.perf_counter()
    dst.copy_(src)
    return float(src.numel() * 4 / max(time.perf_counter() - start, 1e-9))


def _prefill_tokens_per_s(runner: Any) -> float:
    """A timed prefill of MEASURE_TOKENS tokens written to the padding slot (as the warm-up)."""
    from runtime.execution.forward_batch import ForwardEntry

    n = MEASURE_TOKENS
    entry = ForwardEntry(row=0, input_ids=[1] * n, prefix_len=0, kv_write=[0] * n, kv_write_start=0)
    start = time.perf_counter()
    runner.forward([entry])
    return n / max(time.perf_counter() - start, 1e-9)
