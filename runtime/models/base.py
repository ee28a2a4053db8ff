"""One decoder for Llama, Qwen2, Qwen3 and Phi-3, parameterized by `ModelConfig`.

Per layer: RMSNorm -> fused qkv projection -> (Qwen3: per-head q/k RMSNorm) -> rotary ->
backend attention (writes K/V to the paged pool) -> o_proj -> residual add + RMSNorm -> fused
gate_up -> SiLU(gate) * up -> down. Activations (and rotary, as in HF) are in the model dtype; norms in fp32.

Parameter names follow the HF checkpoint's, except the fused `qkv_proj` (q, k, v rows) and
`gate_up_proj` (gate, up rows), which `load_weights` fills shard by shard.

Tensor parallelism lives in the layers (runtime/parallel/layers.py): each holds this rank's
shard, loads it from the whole checkpoint tensors and runs its collective (an all-reduce after
o_proj, after down_proj and after the embedding lookup; a gather of the logits). Without `tp` the
same layers run on one rank, where the shards are whole and the collectives do nothing.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from types import ModuleType
from typing import Protocol, cast

import torch
import torch.nn.functional as F
from torch import nn

from kernels.base import AttentionBackend
from kernels.fused_ops import FusedOps
from kernels.linear import Linear
from kernels.norm import RMSNorm
from kernels.rotary import RotaryEmbedding, RotaryRows
from runtime.contracts.errors import UnsupportedModel
from runtime.contracts.model_config import ModelConfig
from runtime.models.decode_stack import BlockLayer, DecodeStack
from runtime.parallel.context import ParallelContext, rank_context
from runtime.parallel.layers import (
    ColumnParallelLinear,
    ParallelLMHead,
    QKVParallelLinear,
    RowParallelLinear,
    ShardedWeights,
    VocabParallelEmbedding,
    load_replicated,
)

# Checkpoint tensors that carry no weights (precomputed rotary buffers of old exports).
IGNORED_SUFFIXES = ("rotary_emb.inv_freq", "rotary_emb.cos_cached", "rotary_emb.sin_cached")


class Attention(nn.Module):
    """`cfg` is the whole model's; this rank computes the heads its plan places here."""

    def __init__(
        self, cfg: ModelConfig, layer_id: int, dtype: torch.dtype, device: torch.device, tp: ParallelContext
    ) -> None:
        super().__init__()
        plan = tp.plan
        self.layer_id = layer_id
        self.num_heads, self.num_kv_heads, self.head_dim = len(plan.q_heads), len(plan.kv_heads), cfg.head_dim
        self.q_size, self.kv_size = len(plan.q_rows), len(plan.kv_rows)
        self.qkv_proj = QKVParallelLinear(
            cfg.hidden_size, cfg.head_dim, cfg.num_heads, cfg.num_kv_heads, cfg.qkv_bias, tp, dtype, device
        )
        self.o_proj = RowParallelLinear(cfg.q_size, cfg.hidden_size, cfg.o_bias, tp, dtype, device, plan.q_rows)
        self.kernels: FusedOps | None = None  # fused ops: the rotary in one op
        self.qk_norm = cfg.qk_norm
        if cfg.qk_norm:
            self.q_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps, dtype, device)
            self.k_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps, dtype, device)

    def forward(self, h: torch.Tensor, cos_sin: RotaryRows, backend: AttentionBackend) -> torch.Tensor:
        T, nh = h.shape[0], self.num_heads
        qkv = self.qkv_proj(h)
        # q and k are adjacent in qkv: rotate them together as one [T, nh + nkv, d] tensor.
        qk = qkv[:, : self.q_size + self.kv_size].view(T, nh + self.num_kv_heads, self.head_dim)
        v = qkv[:, self.q_size + self.kv_size :].view(T, self.num_kv_heads, self.head_dim)
        if self.qk_norm:
            qk = torch.cat([self.q_norm(qk[:, :nh]), self.k_norm(qk[:, nh:])], dim=1)
        qk = (self.kernels.rotary(qk, cos_sin) if self.kernels is not None
              else RotaryEmbedding.rotate(qk, cos_sin))
        # NOTE: q, k and v are strided views (rows of a wider tensor); split dims with view, not flatten T.
        out: torch.Tensor = self.o_proj(backend.forward(self.layer_id, qk[:, :nh], qk[:, nh:], v))
        return out


class MLP(nn.Module):
    """gate_up (column-parallel: this rank's slice of the intermediate size) -> SiLU(gate) * up ->
    down (row-parallel: the all-reduce)."""

    def __init__(self, cfg: ModelConfig, dtype: torch.dtype, device: torch.device, tp: ParallelContext) -> None:
        super().__init__()
        size = cfg.intermediate_size
        self.gate_up_proj = ColumnParallelLinear(cfg.hidden_size, [size, size], cfg.mlp_bias, tp, dtype, device)
        self.down_proj = RowParallelLinear(size, cfg.hidden_size, cfg.mlp_bias, tp, dtype, device)
        self.kernels: FusedOps | None = None  # fused ops: SiLU(gate) * up in one op

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        gate_up = self.gate_up_proj(h)
        if self.kernels is not None:
            act = self.kernels.silu_mul(gate_up)
        else:
            gate, up = gate_up.chunk(2, dim=-1)
            act = F.silu(gate) * up
        out: torch.Tensor = self.down_proj(act)
        return out


class DecoderLayer(nn.Module):
    """Pre-norm attention and MLP blocks, with the residual adds fused into the norms."""

    def __init__(
        self, cfg: ModelConfig, layer_id: int, dtype: torch.dtype, device: torch.device, tp: ParallelContext
    ) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, dtype, device)
        self.self_attn = Attention(cfg, layer_id, dtype, device, tp)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, dtype, device)
        self.mlp = MLP(cfg, dtype, device, tp)

    def block_layer(self) -> BlockLayer | None:
        """This layer as one decode_layer call, when its linears are all GGUF blocks (else None)."""
        attn, mlp, norms = self.self_attn, self.mlp, (self.input_layernorm, self.post_attention_layernorm)
        if attn.qk_norm or norms[0].eps != norms[1].eps:
            return None
        return BlockLayer.of([n.weight for n in norms], norms[0].eps,
                             [attn.qkv_proj, attn.o_proj, mlp.gate_up_proj, mlp.down_proj])

    def forward(
        self, h: torch.Tensor, residual: torch.Tensor | None, cos_sin: RotaryRows, backend: AttentionBackend
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(h, residual) -> (h, residual): the residual stream is added lazily by the next norm."""
        if residual is None:
            h, residual = self.input_layernorm(h), h
        else:
            h, residual = self.input_layernorm(h, residual)
        h = self.self_attn(h, cos_sin, backend)
        h, residual = self.post_attention_layernorm(h, residual)
        return self.mlp(h), residual


class DecoderModel(nn.Module):
    """Embeddings -> decoder layers -> final norm: token ids to final hidden states."""

    def __init__(self, cfg: ModelConfig, dtype: torch.dtype, device: torch.device, tp: ParallelContext) -> None:
        super().__init__()
        self.embed_tokens = VocabParallelEmbedding(cfg.vocab_size, cfg.hidden_size, tp, dtype, device)
        self.layers = nn.ModuleList(DecoderLayer(cfg, i, dtype, device, tp) for i in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, dtype=dtype, device=device)
        self.rotary = RotaryEmbedding(
            cfg.head_dim, cfg.max_position_embeddings, cfg.rope_theta, cfg.rope_scaling, dtype, device
        )
        self.decode_stack: DecodeStack | None = None  # decode steps' layers in C++, when they can (use_decode_stack)

    def use_decode_stack(self, ext: ModuleType | None) -> None:
        """Run decode steps' layers as one C++ call each where they can (runtime/models/decode_stack.py)."""
        layers = cast("list[DecoderLayer]", list(self.layers))
        attn = layers[0].self_attn if layers else None
        self.decode_stack = None if attn is None else DecodeStack.build(
            [layer.block_layer() for layer in layers], self.embed_tokens.size, attn.num_heads, attn.head_dim, ext)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, backend: AttentionBackend) -> torch.Tensor:
        h = self.embed_tokens(input_ids)
        cos_sin = self.rotary.lookup(positions)
        stacked = None
        if self.decode_stack is not None and (inputs := backend.decode_kernel_inputs()) is not None:
            stacked = self.decode_stack.run(h, cos_sin.table, inputs)
        if stacked is not None:
            h, residual = stacked
        else:
            residual = None
            for layer in self.layers:
                h, residual = layer(h, residual, cos_sin, backend)
        h, _ = self.norm(h, residual)
        return h


class Decoder(Protocol):
    """What the rest of the runtime uses of a CausalLM's decoder (DecoderModel, or Gemma's)."""

    embed_tokens: VocabParallelEmbedding
    rotary: RotaryEmbedding

    def __call__(self, input_ids: torch.Tensor, positions: torch.Tensor, backend: AttentionBackend) -> torch.Tensor:
        ...

    def use_decode_stack(self, ext: ModuleType | None) -> None:
        ...

    def modules(self) -> Iterator[nn.Module]:
        ...


# HF projection name -> (fused module name, shard index). Shards are stacked along dim 0 in order.
FUSED_SHARDS = {
    "q_proj": ("qkv_proj", 0), "k_proj": ("qkv_proj", 1), "v_proj": ("qkv_proj", 2),
    "gate_proj": ("gate_up_proj", 0), "up_proj": ("gate_up_proj", 1),
}


class CausalLM(nn.Module):
    """The decoder plus lm_head; architecture classes (llama.py, phi3.py, qwen2.py, qwen3.py, gemma.py) subclass it."""

    architectures: tuple[str, ...] = ()  # the HF `architectures` names a subclass serves

    def __init__(
        self, config: ModelConfig, dtype: torch.dtype, device: torch.device, tp: ParallelContext | None = None
    ) -> None:
        super().__init__()
        parallel = rank_context(tp, config)
        # `config` is the whole model's; `self.config` the shapes this rank holds (equal without tp).
        self.global_config, self.config = config, parallel.plan.local_config(config)
        self.dtype, self.device = dtype, device
        self.model: Decoder = self.decoder(config, dtype, device, parallel)
        self.lm_head = ParallelLMHead(config.vocab_size, config.hidden_size, parallel, dtype, device)
        if config.tie_word_embeddings:
            self.lm_head.tie(self.model.embed_tokens)
        self.is_packed = False

    def decoder(self, cfg: ModelConfig, dtype: torch.dtype, device: torch.device, tp: ParallelContext) -> Decoder:
        """The decoder (token ids to final hidden states); Gemma's differs (runtime/models/gemma.py)."""
        return DecoderModel(cfg, dtype, device, tp)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, backend: AttentionBackend) -> torch.Tensor:
        """input_ids, positions: int64 [T] -> final hidden states [T, hidden] (model dtype)."""
        hidden: torch.Tensor = self.model(input_ids, positions, backend)
        return hidden

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [N, hidden] -> fp32 logits [N, vocab] (see ParallelLMHead.forward). Pass only
        the rows that need logits."""
        logits: torch.Tensor = self.lm_head(hidden)
        return logits

    def use_fused_ops(self, ops: FusedOps | None) -> None:
        """Run the norms, the MLP activation and the rotary through fused ops (kernels/fused_ops.py;
        None: torch ops)."""
        for module in self.modules():
            if isinstance(module, (RMSNorm, MLP, Attention)):
                module.kernels = ops

    def quantizable_linears(self) -> Iterator[Linear]:
        """The linears a weight quantization applies to: the decoder's, not the lm_head.

        The lm_head keeps full precision: its int8 error moved near-tied greedy tokens of the
        default model's chat answers (fp32: 2 of 4 prompts unchanged for 32 tokens instead of
        3), for 1.2x more single-stream speed on the AVX2 CPU.
        """
        assert not self.is_packed, "quantize before pack(), which drops the plain weights"
        return (m for m in self.model.modules() if isinstance(m, Linear))

    def pack(self) -> None:
        """Prepack every linear weight for the device, once, after loading."""
        for module in self.modules():
            if isinstance(module, Linear):
                module.pack()
        self.is_packed = True

    def load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Copy HF-named tensors into the (fused) parameters, each layer keeping its own shard,
        casting to the model dtype.

        Raises UnsupportedModel for a name the model does not know and ValueError for a shape
        mismatch or, at the end, for any parameter the checkpoint did not provide.
        """
        assert not self.is_packed, "load_weights must run before pack()"
        params = dict(self.named_parameters())
        loaded: dict[str, set[int]] = {}
        for name, tensor in named_tensors:
            if name.endswith(IGNORED_SUFFIXES) or (name == "lm_head.weight" and self.config.tie_word_embeddings):
                continue
            target, shard = self._target(name, params)
            loaded.setdefault(target, set()).add(shard)
            try:
                self._load(target, params[target], tensor, shard)
            except ValueError as err:
                raise ValueError(f"checkpoint tensor {name!r} {err} (for {target})") from err
        self._check_all_loaded(params, loaded)

    @torch.no_grad()
    def fill_param(self, name: str, whole: torch.Tensor) -> None:
        """Set our parameter `name` from its whole-model value (dummy weights: drawn once at the
        whole model's shapes, so every tp_size gets the same model)."""
        module = self._owner(name)
        param = dict(self.named_parameters())[name]
        if isinstance(module, ShardedWeights):
            module.load_whole(param, whole)
        else:
            load_replicated(param, whole)

    def _load(self, target: str, param: nn.Parameter, tensor: torch.Tensor, shard: int) -> None:
        module = self._owner(target)
        if isinstance(module, ShardedWeights):
            module.weight_loader(param, tensor, shard)
        else:
            load_replicated(param, tensor)

    def _owner(self, param_name: str) -> nn.Module:
        return self.get_submodule(param_name.rpartition(".")[0])

    def _num_shards(self, param_name: str) -> int:
        module = self._owner(param_name)
        return module.num_shards if isinstance(module, ShardedWeights) else 1

    def _target(self, name: str, params: dict[str, nn.Parameter]) -> tuple[str, int]:
        """(our parameter name, shard index) for one HF tensor name."""
        parts = name.split(".")
        if len(parts) >= 2 and parts[-2] in FUSED_SHARDS:
            fused, shard = FUSED_SHARDS[parts[-2]]
            target = ".".join(parts[:-2] + [fused, parts[-1]])
        else:
            target, shard = name, 0
        if target not in params:
            raise UnsupportedModel(f"checkpoint tensor {name!r} has no place in {self.config.architecture}")
        return target, shard

    def _check_all_loaded(self, params: dict[str, nn.Parameter], loaded: dict[str, set[int]]) -> None:
        missing = [name for name in params if loaded.get(name, set()) != set(range(self._num_shards(name)))]
        if missing:
            shown = ", ".join(missing[:8]) + (f" and {len(missing) - 8} more" if len(missing) > 8 else "")
            raise ValueError(f"checkpoint is missing {len(missing)} weight(s): {shown}")
