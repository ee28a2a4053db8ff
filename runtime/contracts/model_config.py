"""The model's shape, parsed once from a Hugging Face `config.json` dict.

Both config generations are read: transformers v5 writes `rope_parameters: {rope_theta, rope_type,
...}` and `dtype`; older checkpoints write top-level `rope_theta`, `rope_scaling` and `torch_dtype`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from runtime.contracts.errors import UnsupportedModel

# Architecture name -> (qkv bias forced on, per-head q/k RMSNorm). Mistral is Llama with a
# sliding window on every layer (v0.1: 4096; v0.2/v0.3 ship `sliding_window: null`). Phi-3 is
# Llama with q/k/v and gate/up fused in the checkpoint (runtime/models/phi3.py splits them) and,
# for the 4k models, a window of 2047. Gemma 2 and 3 (runtime/models/gemma.py) alternate sliding
# and global layers (`layer_types`).
ARCHITECTURES: dict[str, tuple[bool, bool]] = {
    "LlamaForCausalLM": (False, False),
    "MistralForCausalLM": (False, False),
    "Phi3ForCausalLM": (False, False),
    "Qwen2ForCausalLM": (True, False),
    "Qwen3ForCausalLM": (False, True),
    "Qwen3MoeForCausalLM": (False, True),
    "Gemma2ForCausalLM": (False, False),
    "Gemma3ForCausalLM": (False, True),
}
# Architectures whose MLP blocks are (some of them) sparse mixtures of experts (`MoeConfig`).
MOE_ARCHITECTURES = ("Qwen3MoeForCausalLM",)
GEMMA = ("Gemma2ForCausalLM", "Gemma3ForCausalLM")
# Gemma's `sliding_window_pattern` defaults (every n-th layer is global) when config.json has no `layer_types`.
GEMMA_PATTERN = {"Gemma2ForCausalLM": 2, "Gemma3ForCausalLM": 6}
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
    # Sliding-window attention, per layer: a query at position q sees keys p with q - w < p <= q
    # (HF's masks); None: every earlier key. Empty: no layer has a window.
    layer_windows: tuple[int | None, ...] = ()
    hidden_act: str = "silu"  # silu, or gelu_pytorch_tanh (Gemma's GeGLU)
    attn_scale: float | None = None  # the softmax scale; None: head_dim ** -0.5 (Gemma: query_pre_attn_scalar ** -0.5)
    attn_softcap: float | None = None  # scores -> cap * tanh(scores / cap) before the softmax (Gemma 2)
    final_softcap: float | None = None  # the same on the logits (Gemma 2)
    rope_local_theta: float | None = None  # the sliding layers' rope base, unscaled (Gemma 3); None: rope_theta

    def window(self, layer_id: int) -> int | None:
        """The sliding window of layer `layer_id`, or None for full attention."""
        return self.layer_windows[layer_id] if self.layer_windows else None

    @property
    def softmax_scale(self) -> float:
        return self.attn_scale if self.attn_scale is not None else self.head_dim**-0.5

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
        theta, scaling, local_theta = _gemma_rope(hf) if arch in GEMMA else (*_rope(hf), None)
        scalar = hf.get("query_pre_attn_scalar") if arch in GEMMA else None
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
            layer_windows=_layer_windows(arch, hf),
            hidden_act=_activation(arch, hf),
            attn_scale=float(scalar) ** -0.5 if scalar else None,
            attn_softcap=_cap(hf.get("attn_logit_softcapping")) if arch in GEMMA else None,
            final_softcap=_cap(hf.get("final_logit_softcapping")) if arch in GEMMA else None,
            rope_local_theta=local_theta,
        )


def _architecture(hf: dict[str, Any]) -> str:
    archs: list[str] = hf.get("architectures") or []
    supported = ", ".join(ARCHITECTURES)
    arch = next((a for a in archs if a in ARCHITECTURES), None)
    if arch is None:
        raise UnsupportedModel(f"unsupported model architecture {archs or '(none given)'}; supported: {supported}")
    _activation(arch, hf)
    return arch


def _activation(arch: str, hf: dict[str, Any]) -> str:
    """silu, or Gemma's gelu_pytorch_tanh (HF reads `hidden_activation` there, then `hidden_act`)."""
    if arch in GEMMA:
        act = hf.get("hidden_activation") or hf.get("hidden_act") or "gelu_pytorch_tanh"
        if act not in ("gelu_pytorch_tanh", "gelu_tanh"):
            raise UnsupportedModel(f"{arch} with hidden_activation={act!r} is not supported (only gelu_pytorch_tanh)")
        return "gelu_pytorch_tanh"
    if hf.get("hidden_act", "silu") != "silu":
        raise UnsupportedModel(f"{arch} with hidden_act={hf['hidden_act']!r} is not supported (only silu)")
    return "silu"


def _layer_windows(arch: str, hf: dict[str, Any]) -> tuple[int | None, ...]:
    """Each layer's sliding window, or () when none applies.

    A window at least as long as the context never drops a key: it is left out (full attention),
    so such configs keep every path full attention has. Qwen2's window applies only with
    `use_sliding_window` (and there to the layers from `max_window_layers` on); it stays refused.
    """
    window = int(hf.get("sliding_window") or 0)
    context = hf.get("max_position_embeddings", DEFAULT_CONTEXT)
    layers: int = hf["num_hidden_layers"]
    if not window or window >= context:
        return ()
    if arch in GEMMA:
        if hf.get("use_bidirectional_attention"):
            raise UnsupportedModel(f"{arch} with use_bidirectional_attention is not supported (a decoder only)")
        pattern = GEMMA_PATTERN[arch]
        types: list[str] = hf.get("layer_types") or [
            "full_attention" if (i + 1) % pattern == 0 else "sliding_attention" for i in range(layers)]
        return tuple(window if t == "sliding_attention" else None for t in types)
    if hf.get("use_sliding_window", arch in WINDOWED_BY_DEFAULT):
        if arch not in WINDOWED_BY_DEFAULT:
            raise UnsupportedModel(f"{arch} with use_sliding_window and sliding_window={window} is not supported")
        return (window,) * layers
    return ()


def _gemma_rope(hf: dict[str, Any]) -> tuple[float, dict[str, Any] | None, float | None]:
    """(global theta, global scaling, local theta) from Gemma's config: v5 writes `rope_parameters`
    per layer type; older configs `rope_theta`, `rope_scaling` and (Gemma 3) `rope_local_base_freq`."""
    params = hf.get("rope_parameters") or {}
    if "full_attention" in params:
        local = dict(params.get("sliding_attention") or {})
        if (local.get("rope_type") or "default") != "default":
            raise UnsupportedModel(f"Gemma sliding layers with rope {local} are not supported")
        theta, scaling = _rope({**hf, "rope_parameters": params["full_attention"]})
        return theta, scaling, float(local.get("rope_theta") or 10000.0)
    theta, scaling = _rope(hf)
    local_theta = hf.get("rope_local_base_freq")
    return theta, scaling, float(local_theta) if local_theta else None


def _cap(value: Any) -> float | None:
    return float(value) if value else None


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
