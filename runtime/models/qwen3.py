"""Qwen3: the shared decoder with per-head q/k RMSNorm before rotary (ModelConfig.qk_norm)."""

from __future__ import annotations

from runtime.models.base import CausalLM


class Qwen3ForCausalLM(CausalLM):
    architectures = ("Qwen3ForCausalLM",)
