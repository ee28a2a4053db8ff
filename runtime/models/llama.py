"""Llama and Mistral: the shared decoder as is.

Mistral's checkpoint and decoder are Llama's; it differs only by `sliding_window` (v0.1: 4096),
which `ModelConfig.layer_windows` carries to the attention backend (kernels/sliding_window.py).
"""

from __future__ import annotations

from runtime.models.base import CausalLM


class LlamaForCausalLM(CausalLM):
    architectures = ("LlamaForCausalLM", "MistralForCausalLM")
