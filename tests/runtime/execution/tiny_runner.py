"""Model runners over dummy-weight models of a given shape, for runner-level tests (no checkpoint)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from runtime.contracts.config import ServerConfig
from runtime.execution.model_runner import ModelRunner
from runtime.execution.model_setup import LoadedModel, load_model_for_serving
from runtime.execution.resolve import resolve_config

# Real models' head layouts on a toy width: (num_heads, num_kv_heads, head_dim).
SHAPES = {
    "llama-3.2-1b": (32, 8, 64),  # group 4
    "qwen2-group7": (14, 2, 64),  # group 7, as Qwen2.5-7B (28 / 4)
    "smollm2": (9, 3, 64),  # group 3
}


def write_config(folder: Path, heads: int, kv_heads: int, head_dim: int, layers: int = 2, vocab: int = 512) -> str:
    folder.mkdir(parents=True, exist_ok=True)
    config = dict(
        architectures=["LlamaForCausalLM"], model_type="llama", hidden_size=128,
        head_dim=head_dim, intermediate_size=256, num_hidden_layers=layers, num_attention_heads=heads,
        num_key_value_heads=kv_heads, vocab_size=vocab, max_position_embeddings=512, rms_norm_eps=1e-6,
        tie_word_embeddings=True, torch_dtype="float32",
    )
    (folder / "config.json").write_text(json.dumps(config))
    return str(folder)


def make_runner(model_path: str, backend: str = "torch", page_size: int = 1, dtype: str = "float32",
                workspace_bytes: int = 1 << 16) -> ModelRunner:
    """A CPU runner; backend "fake-flashinfer" drives our FlashInfer backend over the stand-in
    module (which must be installed: tests/kernels/fake_flashinfer.install), in a 16-bit `dtype`
    (FlashInfer has no fp32 kernels: the stand-in refuses fp32 as the real library does)."""
    cfg = resolve_config(ServerConfig(
        model_path=model_path, device="cpu", load_format="dummy", dtype=dtype, page_size=page_size,
        max_total_tokens=2048, max_running_requests=16, context_length=512,
    ))
    loaded = load_model_for_serving(cfg)
    if backend == "fake-flashinfer":
        loaded = with_flashinfer_backend(loaded, workspace_bytes)
    return ModelRunner(loaded)


def with_flashinfer_backend(loaded: LoadedModel, workspace_bytes: int = 1 << 16) -> LoadedModel:
    """`loaded` with our FlashInfer backend on its pool, FlashInfer's fused per-token ops in its
    model and its sampler, as load_model_for_serving sets them up on CUDA: on CPU, where
    resolve_config never picks them, over whatever `flashinfer` module is installed (the
    stand-in), small workspace."""
    from runtime.execution.backends import make_backend
    from runtime.execution.model_setup import use_flashinfer_kernels

    sampler = use_flashinfer_kernels(loaded.model)
    # One backend per sliding window (and the model's scale and soft cap), as on CUDA.
    backend = make_backend("flashinfer", loaded.kv_pool, loaded.model.config, loaded.dtype, workspace_bytes)
    return dataclasses.replace(loaded, backend=backend, sampler=sampler)


@pytest.fixture
def fake_flashinfer(monkeypatch: pytest.MonkeyPatch):
    from tests.kernels import fake_flashinfer

    return fake_flashinfer.install(monkeypatch)
