"""Phi-3: the shared decoder; its checkpoint stores q/k/v and gate/up already fused.

`qkv_proj` holds the q, k and v rows stacked and `gate_up_proj` the gate and up rows, in the
order our fused layers use. `load_weights` splits them into the per-projection tensors the shared
loader takes, so each tensor-parallel layer still cuts its own shard from whole q, k, v, gate, up.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import torch

from runtime.models.base import CausalLM


class Phi3ForCausalLM(CausalLM):
    architectures = ("Phi3ForCausalLM",)

    def load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        super().load_weights(self._split_fused(named_tensors))

    def _split_fused(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> Iterator[tuple[str, torch.Tensor]]:
        """Phi-3's fused tensors as the HF q/k/v and gate/up tensors they stack; others as they are."""
        cfg = self.global_config
        splits = {
            "qkv_proj": (("q_proj", "k_proj", "v_proj"), [cfg.q_size, cfg.kv_size, cfg.kv_size]),
            "gate_up_proj": (("gate_proj", "up_proj"), [cfg.intermediate_size, cfg.intermediate_size]),
        }
        for name, tensor in named_tensors:
            prefix, fused, leaf = _split_name(name)
            if fused not in splits:
                yield name, tensor
                continue
            parts, sizes = splits[fused]
            if tensor.shape[0] != sum(sizes):
                raise ValueError(f"checkpoint tensor {name!r} has {tensor.shape[0]} rows, expected {sum(sizes)}")
            for part, piece in zip(parts, tensor.split(sizes, dim=0), strict=True):
                yield f"{prefix}{part}.{leaf}", piece


def _split_name(name: str) -> tuple[str, str, str]:
    """"a.b.qkv_proj.weight" -> ("a.b.", "qkv_proj", "weight")."""
    head, _, leaf = name.rpartition(".")
    prefix, _, module = head.rpartition(".")
    return (prefix + "." if prefix else ""), module, leaf
