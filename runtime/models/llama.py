"""Llama (and Mistral without sliding windows): the shared decoder as is."""

from __future__ import annotations

from runtime.models.base import CausalLM


class LlamaForCausalLM(CausalLM):
    architectures = ("LlamaForCausalLM", "MistralForCausalLM")
