"""Llama, and Mistral without a sliding window: the shared decoder as is.

Mistral's checkpoint and decoder are Llama's; it differs only by `sliding_window`, and
`runtime/contracts/model_config.py` refuses a window shorter than the context before we get here.
"""

from __future__ import annotations

from runtime.models.base import CausalLM


class LlamaForCausalLM(CausalLM):
    architectures = ("LlamaForCausalLM", "MistralForCausalLM")
