"""The model registry: HF architecture name -> model class, and `build_model`."""

from __future__ import annotations

import torch

from runtime.contracts.errors import UnsupportedModel
from runtime.contracts.model_config import ModelConfig
from runtime.models.base import CausalLM
from runtime.models.gemma import GemmaForCausalLM
from runtime.models.llama import LlamaForCausalLM
from runtime.models.phi3 import Phi3ForCausalLM
from runtime.models.qwen2 import Qwen2ForCausalLM
from runtime.models.qwen3 import Qwen3ForCausalLM
from runtime.models.qwen3_moe import Qwen3MoeForCausalLM
from runtime.parallel.context import ParallelContext

MODEL_REGISTRY: dict[str, type[CausalLM]] = {
    arch: cls
    for cls in (LlamaForCausalLM, Phi3ForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM, Qwen3MoeForCausalLM,
                GemmaForCausalLM)
    for arch in cls.architectures
}


def build_model(
    model_config: ModelConfig, dtype: torch.dtype, device: torch.device, tp: ParallelContext | None = None
) -> CausalLM:
    """An unloaded model (uninitialized weights) on `device`, this rank's part of it under `tp`
    (a `runtime.parallel.group.TensorParallel`); fill it with `load_weights`."""
    cls = MODEL_REGISTRY.get(model_config.architecture)
    if cls is None:
        raise UnsupportedModel(
            f"unsupported model architecture {model_config.architecture!r}; supported: {', '.join(MODEL_REGISTRY)}"
        )
    return cls(model_config, dtype, device, tp)


__all__ = ["MODEL_REGISTRY", "CausalLM", "ModelConfig", "build_model"]
