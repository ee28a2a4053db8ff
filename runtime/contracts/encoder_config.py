"""The shape of an encoder (BERT) model, parsed from its `config.json` dict.

Encoders are served for embeddings only (`scheduler/encoder_loop.py`): no KV cache, no sampling.
`is_encoder` decides, from config.json alone, which of the two kinds a folder holds.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from runtime.contracts.errors import UnsupportedModel

ENCODER_ARCHITECTURES = ("BertModel", "BertForMaskedLM", "BertForPreTraining")
ENCODER_MODEL_TYPES = ("bert",)
GELU_ACTS = ("gelu",)  # HF's "gelu" is the exact (erf) GELU


def is_encoder(hf: dict[str, Any]) -> bool:
    """The config describes a BERT encoder."""
    archs = hf.get("architectures") or []
    return any(a in ENCODER_ARCHITECTURES for a in archs) or (not archs and hf.get("model_type") in ENCODER_MODEL_TYPES)


@dataclass(frozen=True)
class EncoderConfig:
    architecture: str
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    vocab_size: int
    max_position_embeddings: int
    type_vocab_size: int
    layer_norm_eps: float
    pad_token_id: int

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @classmethod
    def from_hf(cls, hf: dict[str, Any]) -> EncoderConfig:
        archs = hf.get("architectures") or ["BertModel"]
        if hf.get("hidden_act", "gelu") not in GELU_ACTS:
            raise UnsupportedModel(f"a BERT encoder with hidden_act={hf['hidden_act']!r} is not supported (only gelu)")
        if hf.get("position_embedding_type", "absolute") != "absolute":
            raise UnsupportedModel("a BERT encoder with position_embedding_type "
                                   f"{hf['position_embedding_type']!r} is not supported (only absolute)")
        if hf["hidden_size"] % hf["num_attention_heads"]:
            raise UnsupportedModel("hidden_size must be a multiple of num_attention_heads")
        return cls(
            architecture=archs[0],
            hidden_size=hf["hidden_size"],
            intermediate_size=hf["intermediate_size"],
            num_layers=hf["num_hidden_layers"],
            num_heads=hf["num_attention_heads"],
            vocab_size=hf["vocab_size"],
            max_position_embeddings=hf.get("max_position_embeddings", 512),
            type_vocab_size=hf.get("type_vocab_size", 2),
            layer_norm_eps=float(hf.get("layer_norm_eps", 1e-12)),
            pad_token_id=int(hf.get("pad_token_id") or 0),
        )
