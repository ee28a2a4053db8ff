"""Gemma 2 and Gemma 3 (text): their own decoder layer on the shared parallel layers.

Differences from the Llama decoder (runtime/models/base.py), all as in Hugging Face's models:
- RMSNorm scales by (1 + weight), in fp32 (`GemmaRMSNorm`); the embedding is multiplied by
  sqrt(hidden_size) rounded to the model dtype;
- four norms a layer: the attention's and the MLP's outputs are normed before their residual add;
- the MLP is GeGLU: gelu_tanh(gate) * up;
- the softmax scale is query_pre_attn_scalar ** -0.5 (ModelConfig.attn_scale, handed to the backend);
- Gemma 2 soft-caps attention scores (the backend) and the final logits (`compute_logits`);
- Gemma 3 norms q and k per head, and rotates its sliding layers with `rope_local_theta`;
- sliding and global layers alternate (ModelConfig.layer_windows; the backend applies them).

It never runs the C++ decode stack (different norms and activation) nor fused ops (their norm
has no (1 + weight), their rotary one table): its modules are none of the types those replace.
"""

from __future__ import annotations

from types import ModuleType
from typing import cast

import torch
import torch.nn.functional as F
from torch import nn

from kernels.base import AttentionBackend
from kernels.rotary import RotaryEmbedding, RotaryRows
from runtime.contracts.model_config import ModelConfig
from runtime.models.base import CausalLM, Decoder
from runtime.models.decode_stack import DecodeStack
from runtime.parallel.context import ParallelContext
from runtime.parallel.layers import (
    ColumnParallelLinear,
    QKVParallelLinear,
    RowParallelLinear,
    VocabParallelEmbedding,
)


class GemmaRMSNorm(nn.Module):
    """x * rsqrt(mean(x^2) + eps) * (1 + weight), all in fp32, cast back to x's dtype."""

    def __init__(self, dim: int, eps: float, dtype: torch.dtype, device: torch.device) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(dim, dtype=dtype, device=device), requires_grad=False)
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        out = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return (out * (1.0 + self.weight.float())).to(x.dtype)


class GemmaAttention(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_id: int, dtype: torch.dtype, device: torch.device,
                 tp: ParallelContext) -> None:
        super().__init__()
        plan = tp.plan
        self.layer_id = layer_id
        self.local = cfg.window(layer_id) is not None  # a sliding layer: Gemma 3 rotates it by the local base
        self.num_heads, self.num_kv_heads, self.head_dim = len(plan.q_heads), len(plan.kv_heads), cfg.head_dim
        self.q_size, self.kv_size = len(plan.q_rows), len(plan.kv_rows)
        self.qkv_proj = QKVParallelLinear(
            cfg.hidden_size, cfg.head_dim, cfg.num_heads, cfg.num_kv_heads, cfg.qkv_bias, tp, dtype, device)
        self.o_proj = RowParallelLinear(cfg.q_size, cfg.hidden_size, cfg.o_bias, tp, dtype, device, plan.q_rows)
        self.qk_norm = cfg.qk_norm
        if cfg.qk_norm:
            self.q_norm = GemmaRMSNorm(cfg.head_dim, cfg.rms_norm_eps, dtype, device)
            self.k_norm = GemmaRMSNorm(cfg.head_dim, cfg.rms_norm_eps, dtype, device)

    def forward(self, h: torch.Tensor, rows: RotaryRows, backend: AttentionBackend) -> torch.Tensor:
        T, nh, nkv, d = h.shape[0], self.num_heads, self.num_kv_heads, self.head_dim
        qkv = self.qkv_proj(h)
        q = qkv[:, : self.q_size].view(T, nh, d)
        k = qkv[:, self.q_size : self.q_size + self.kv_size].view(T, nkv, d)
        v = qkv[:, self.q_size + self.kv_size :].view(T, nkv, d)
        if self.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = RotaryEmbedding.rotate(q, rows), RotaryEmbedding.rotate(k, rows)
        out: torch.Tensor = self.o_proj(backend.forward(self.layer_id, q, k, v))
        return out


class GemmaMLP(nn.Module):
    """GeGLU: down(gelu_tanh(gate) * up)."""

    def __init__(self, cfg: ModelConfig, dtype: torch.dtype, device: torch.device, tp: ParallelContext) -> None:
        super().__init__()
        size = cfg.intermediate_size
        self.gate_up_proj = ColumnParallelLinear(cfg.hidden_size, [size, size], cfg.mlp_bias, tp, dtype, device)
        self.down_proj = RowParallelLinear(size, cfg.hidden_size, cfg.mlp_bias, tp, dtype, device)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj(h).chunk(2, dim=-1)
        out: torch.Tensor = self.down_proj(F.gelu(gate, approximate="tanh") * up)
        return out


class GemmaDecoderLayer(nn.Module):
    """norm -> attention -> norm -> + residual -> norm -> MLP -> norm -> + residual."""

    def __init__(self, cfg: ModelConfig, layer_id: int, dtype: torch.dtype, device: torch.device,
                 tp: ParallelContext) -> None:
        super().__init__()
        norm = lambda: GemmaRMSNorm(cfg.hidden_size, cfg.rms_norm_eps, dtype, device)  # noqa: E731
        self.input_layernorm, self.post_attention_layernorm = norm(), norm()
        self.pre_feedforward_layernorm, self.post_feedforward_layernorm = norm(), norm()
        self.self_attn = GemmaAttention(cfg, layer_id, dtype, device, tp)
        self.mlp = GemmaMLP(cfg, dtype, device, tp)

    def forward(self, h: torch.Tensor, rows: RotaryRows, backend: AttentionBackend) -> torch.Tensor:
        h = h + self.post_attention_layernorm(self.self_attn(self.input_layernorm(h), rows, backend))
        return h + self.post_feedforward_layernorm(self.mlp(self.pre_feedforward_layernorm(h)))


class GemmaModel(nn.Module):
    """Scaled embeddings -> Gemma layers -> final norm. `rotary` is the global layers' table;
    `local_rotary` the sliding layers' (Gemma 3's own base; Gemma 2's is the same table)."""

    def __init__(self, cfg: ModelConfig, dtype: torch.dtype, device: torch.device, tp: ParallelContext) -> None:
        super().__init__()
        self.embed_tokens = VocabParallelEmbedding(cfg.vocab_size, cfg.hidden_size, tp, dtype, device)
        self.layers = nn.ModuleList(GemmaDecoderLayer(cfg, i, dtype, device, tp) for i in range(cfg.num_layers))
        self.norm = GemmaRMSNorm(cfg.hidden_size, cfg.rms_norm_eps, dtype, device)
        # HF multiplies by sqrt(hidden_size) rounded to the model dtype (a tensor of that dtype).
        self.normalizer = float(torch.tensor(cfg.hidden_size**0.5, dtype=dtype))
        positions = cfg.max_position_embeddings
        self.rotary = RotaryEmbedding(cfg.head_dim, positions, cfg.rope_theta, cfg.rope_scaling, dtype, device)
        self.local_rotary = self.rotary if cfg.rope_local_theta is None else RotaryEmbedding(
            cfg.head_dim, positions, cfg.rope_local_theta, None, dtype, device)
        self.decode_stack: DecodeStack | None = None  # never built: Gemma's layers are not BlockLayers

    def use_decode_stack(self, ext: ModuleType | None) -> None:
        """Gemma's layers do not run as decode_layer calls (their norms and MLP differ)."""

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, backend: AttentionBackend) -> torch.Tensor:
        h = self.embed_tokens(input_ids)
        h = h * self.normalizer
        rows = self.rotary.lookup(positions)
        local = rows if self.local_rotary is self.rotary else self.local_rotary.lookup(positions)
        for layer in cast("list[GemmaDecoderLayer]", list(self.layers)):
            h = layer(h, local if layer.self_attn.local else rows, backend)
        out: torch.Tensor = self.norm(h)
        return out


class GemmaForCausalLM(CausalLM):
    """Gemma 2 and Gemma 3's text model; Gemma 2 also soft-caps the final logits."""

    architectures = ("Gemma2ForCausalLM", "Gemma3ForCausalLM")

    def decoder(self, cfg: ModelConfig, dtype: torch.dtype, device: torch.device, tp: ParallelContext) -> Decoder:
        return GemmaModel(cfg, dtype, device, tp)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = super().compute_logits(hidden)
        cap = self.config.final_softcap
        if cap is None:
            return logits
        return torch.tanh(logits / cap) * cap
