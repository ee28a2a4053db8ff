"""Qwen2: the shared decoder with q/k/v bias (ModelConfig.qkv_bias is always on for Qwen2)."""

from __future__ import annotations

from runtime.models.base import CausalLM


class Qwen2ForCausalLM(CausalLM):
    architectures = ("Qwen2ForCausalLM",)
