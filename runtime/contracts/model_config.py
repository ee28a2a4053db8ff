"""The model's shape, parsed once from a Hugging Face `config.json` dict.

Both config generations are read: transformers v5 writes `rope_parameters: {rope_theta, rope_type,
...}` and `dtype`; older checkpoints write top-level `rope_theta`, `rope_scaling` and `torch_dtype`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from runtime.contracts.errors import UnsupportedModel

# Architecture name -> (qkv bias forced on, per-head q/k RMSNorm). Mistral is Llama without
# sliding windows (7B v0.2/v0.3 ship `sliding_window: null`); `_check_window` rejects a Mistral or
# Phi-3 that actually uses one. Phi-3 is Llama with q/k/v and gate/up fused in the checkpoint
# (runtime/models/phi3.py splits them).
ARCHITECTURES: dict[str, tuple[bool, bool]] = {
    "LlamaForCausalLM": (False, False),
    "MistralForCausalLM": (False, False),
    "Phi3ForCausalLM": (False, False),
    "Qwen2ForCausalLM": (True, False),
    "Qwen3ForCausalLM": (False, True),
    "Qwen3MoeForCausalLM": (False, True),
}
# Architectures whose MLP blocks are (some of them) sparse mixtures of experts (`MoeConfig`).
MOE_ARCHITECTURES = ("Qwen3MoeForCausalLM",)
ROPE_TYPES = ("default", "linear", "llama3")
# Architectures whose HF model applies `sliding_window` whenever it is set (no `use_sliding_window`).
WINDOWED_BY_DEFAULT = ("MistralForCausalLM", "Phi3ForCausalLM")
# The context length assumed when config.json omits max_position_embeddings.
DEFAULT_CONTEXT = 4096


@dataclass(frozen=True)
class MoeConfig:
    """The sparse MLP blocks of a mixture-of-experts model (Qwen3-MoE's config keys)."""

    num_experts: int
    top_k: int  # num_experts_per_tok
    intermediate_size: int  # each expert's (moe_intermediate_size); dense layers keep the model's
    norm_topk_prob: bool  # renormalize the top-k routing weights to sum to 1
    sparse_layers: tuple[int, ...]  # the layers whose MLP is the sparse block; the others stay dense

    @classmethod
    def from_hf(cls, hf: dict[str, Any]) -> MoeConfig:
        """As HF's Qwen3MoeDecoderLayer decides: a layer is sparse unless in `mlp_only_layers`,
        when it is a multiple of `decoder_sparse_step` (counting layers from 1)."""
        # Qwen's config.json names it num_experts; transformers v5 writes num_local_experts.
        experts = int(hf["num_experts"] if "num_experts" in hf else hf.get("num_local_experts", 128))
        step = int(hf.get("decoder_sparse_step", 1))
        dense = set(hf.get("mlp_only_layers") or ())
        sparse = tuple(i for i in range(hf["num_hidden_layers"])
                       if i not in dense and experts > 0 and step > 0 and (i + 1) % step == 0)
        top_k = int(hf.get("num_experts_per_tok", 8))
        if sparse and not 0 < top_k <= experts:
            raise UnsupportedModel(f"num_experts_per_tok={top_k} must be between 1 and num_experts={experts}")
        return cls(num_experts=experts, top_k=top_k,
                   intermediate_size=int(hf.get("moe_intermediate_size", 768)),
                   norm_topk_prob=bool(hf.get("norm_topk_prob", False)), sparse_layers=sparse)


@dataclass(frozen=True)
class ModelConfig:
    architecture: str
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: dict[str, Any] | None  # None for plain RoPE; else {"rope_type": ..., params}
    max_position_embeddings: int
    tie_word_embeddings: bool
    qkv_bias: bool  # bias on q/k/v projections (Qwen2 always; Llama/Qwen3 when attention_bias)
    o_bias: bool  # bias on o_proj (Llama/Qwen3 attention_bias; never Qwen2)
    mlp_bias: bool
    qk_norm: bool  # per-head RMSNorm of q and k before rotary (Qwen3)
    torch_dtype: str | None  # the checkpoint's dtype name, e.g. "bfloat16"
    eos_token_ids: tuple[int, ...]
    moe: MoeConfig | None = None  # the sparse MLP blocks of a mixture-of-experts model

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim

    @classmethod
    def from_hf(cls, hf: dict[str, Any]) -> ModelConfig:
        arch = _architecture(hf)
        force_qkv_bias, qk_norm = ARCHITECTURES[arch]
        attention_bias = bool(hf.get("attention_bias", False))
        heads = hf["num_attention_heads"]
        theta, scaling = _rope(hf)
        return cls(
            architecture=arch,
            hidden_size=hf["hidden_size"],
            intermediate_size=hf["intermediate_size"],
            num_layers=hf["num_hidden_layers"],
            num_heads=heads,
            num_kv_heads=hf.get("num_key_value_heads") or heads,
            head_dim=hf.get("head_dim") or hf["hidden_size"] // heads,
            vocab_size=hf["vocab_size"],
            rms_norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
            rope_theta=theta,
            rope_scaling=scaling,
            max_position_embeddings=hf.get("max_position_embeddings", DEFAULT_CONTEXT),
            tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
            qkv_bias=force_qkv_bias or attention_bias,
            o_bias=attention_bias and not force_qkv_bias,
            mlp_bias=bool(hf.get("mlp_bias", False)),
            qk_norm=qk_norm,
            torch_dtype=_dtype_name(hf.get("dtype") or hf.get("torch_dtype")),
            eos_token_ids=_eos_ids(hf.get("eos_token_id")),
            moe=MoeConfig.from_hf(hf) if arch in MOE_ARCHITECTURES else None,
        )


def _architecture(hf: dict[str, Any]) -> str:
    archs: list[str] = hf.get("architectures") or []
    supported = ", ".join(ARCHITECTURES)
    arch = next((a for a in archs if a in ARCHITECTURES), None)
    if arch is None:
        raise UnsupportedModel(f"unsupported model architecture {archs or '(none given)'}; supported: {supported}")
    if hf.get("hidden_act", "silu") != "silu":
        raise UnsupportedModel(f"{arch} with hidden_act={hf['hidden_act']!r} is not supported (only silu)")
    _check_window(arch, hf)
    return arch


def _check_window(arch: str, hf: dict[str, Any]) -> None:
    """Refuse a sliding window shorter than the context: we run full attention only.

    A window of null, or one at least as long as the context, never drops a key, so full attention
    is exact. The context defaults as in `from_hf`, so what we check is what we serve.
    """
    window = hf.get("sliding_window")
    uses_window = hf.get("use_sliding_window", arch in WINDOWED_BY_DEFAULT)
    context = hf.get("max_position_embeddings", DEFAULT_CONTEXT)
    if uses_window and window and window < context:
        raise UnsupportedModel(
            f"{arch} with sliding_window={window} below max_position_embeddings={context} is not supported "
            "(sliding-window attention is not implemented)"
        )


def _rope(hf: dict[str, Any]) -> tuple[float, dict[str, Any] | None]:
    """(rope_theta, scaling dict or None) from v5 `rope_parameters` or legacy top-level keys."""
    params = dict(hf.get("rope_parameters") or hf.get("rope_scaling") or {})
    theta = float(params.pop("rope_theta", None) or hf.get("rope_theta") or 10000.0)
    rope_type = params.pop("rope_type", None) or params.pop("type", None) or "default"
    params.pop("type", None)
    if rope_type not in ROPE_TYPES:
        # e.g. Phi-3's "longrope", whose short/long factors switch with the whole sequence's length.
        raise UnsupportedModel(
            f"rope_scaling / rope_parameters with rope_type {rope_type!r} is not supported; "
            f"supported: {', '.join(ROPE_TYPES)}"
        )
    partial = float(params.pop("partial_rotary_factor", None) or hf.get("partial_rotary_factor") or 1.0)
    if partial != 1.0:
        raise UnsupportedModel(f"partial_rotary_factor={partial} is not supported (only 1.0: the whole head rotates)")
    if rope_type == "default":
        return theta, None
    if rope_type == "llama3":
        params.setdefault("original_max_position_embeddings", hf.get("max_position_embeddings", 8192))
    return theta, {"rope_type": rope_type, **params}


def _dtype_name(value: Any) -> str | None:
    if value is None:
        return None
    return str(value).removeprefix("torch.")


def _eos_ids(value: Any) -> tuple[int, ...]:
    if value is None:
        return ()
    if isinstance(value, int):
        return (value,)
    return tuple(int(v) for v in value)
