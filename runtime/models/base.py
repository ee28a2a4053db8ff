"""One decoder for Llama, Qwen2 and Qwen3, parameterized by `ModelConfig`.

Per layer: RMSNorm -> fused qkv projection -> (Qwen3: per-head q/k RMSNorm) -> rotary ->
backend attention (writes K/V to the paged pool) -> o_proj -> residual add + RMSNorm -> fused
gate_up -> SiLU(gate) * up -> down. Activations (and rotary, as in HF) are in the model dtype; norms in fp32.

Parameter names follow the HF checkpoint's, except the fused `qkv_proj` (q, k, v rows) and
`gate_up_proj` (gate, up rows), which `load_weights` fills shard by shard.

Tensor parallelism (`tp`, see runtime/parallel/sharding.py): every module is built with this
rank's shapes (`ShardPlan.local_config`), `load_weights` cuts each checkpoint tensor to this
rank's part, and three collectives join the ranks: an all-reduce after o_proj and after
down_proj (row-parallel), one after the vocab-parallel embedding lookup, and a gather of the
vocab-parallel logits. With `tp` None nothing of this runs.
"""

from __future__ import annotations

from collections.abc import Iterable
from types import ModuleType
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from kernels.base import AttentionBackend
from kernels.linear import Linear
from kernels.norm import RMSNorm
from kernels.rotary import RotaryEmbedding, RotaryRows
from runtime.contracts.errors import UnsupportedModel
from runtime.contracts.model_config import ModelConfig

if TYPE_CHECKING:
    from runtime.parallel.group import TensorParallel

# Checkpoint tensors that carry no weights (precomputed rotary buffers of old exports).
IGNORED_SUFFIXES = ("rotary_emb.inv_freq", "rotary_emb.cos_cached", "rotary_emb.sin_cached")


class Attention(nn.Module):
    def __init__(
        self, cfg: ModelConfig, layer_id: int, dtype: torch.dtype, device: torch.device, tp: TensorParallel | None = None
    ) -> None:
        super().__init__()
        self.layer_id = layer_id
        self.tp = tp
        self.num_heads, self.num_kv_heads, self.head_dim = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        self.q_size, self.kv_size = cfg.q_size, cfg.kv_size
        kw = dict(dtype=dtype, device=device)
        self.qkv_proj = Linear(cfg.hidden_size, cfg.q_size + 2 * cfg.kv_size, bias=cfg.qkv_bias, **kw)
        self.o_proj = Linear(cfg.q_size, cfg.hidden_size, bias=cfg.o_bias, **kw)
        self.kernels: ModuleType | None = None  # our C++ CPU kernels: the rotary in one op
        self.qk_norm = cfg.qk_norm
        if cfg.qk_norm:
            self.q_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps, **kw)
            self.k_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps, **kw)

    def forward(self, h: torch.Tensor, cos_sin: RotaryRows, backend: AttentionBackend) -> torch.Tensor:
        T, nh = h.shape[0], self.num_heads
        qkv = self.qkv_proj(h)
        # q and k are adjacent in qkv: rotate them together as one [T, nh + nkv, d] tensor.
        qk = qkv[:, : self.q_size + self.kv_size].view(T, nh + self.num_kv_heads, self.head_dim)
        v = qkv[:, self.q_size + self.kv_size :].view(T, self.num_kv_heads, self.head_dim)
        if self.qk_norm:
            qk = torch.cat([self.q_norm(qk[:, :nh]), self.k_norm(qk[:, nh:])], dim=1)
        if self.kernels is not None:
            qk = self.kernels.rotary(qk, cos_sin.table)
        else:
            qk = RotaryEmbedding.apply(qk, cos_sin)
        # NOTE: q, k and v are strided views (rows of a wider tensor); split dims with view, not flatten T.
        out = self.o_proj(backend.forward(self.layer_id, qk[:, :nh], qk[:, nh:], v))
        return out if self.tp is None else self.tp.group.all_reduce(out)


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig, dtype: torch.dtype, device: torch.device, tp: TensorParallel | None = None) -> None:
        super().__init__()
        self.tp = tp
        kw = dict(bias=cfg.mlp_bias, dtype=dtype, device=device)
        self.gate_up_proj = Linear(cfg.hidden_size, 2 * cfg.intermediate_size, **kw)
        self.down_proj = Linear(cfg.intermediate_size, cfg.hidden_size, **kw)
        self.kernels: ModuleType | None = None  # our C++ CPU kernels: SiLU(gate) * up in one op

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        gate_up = self.gate_up_proj(h)
        if self.kernels is not None:
            out = self.down_proj(self.kernels.silu_mul(gate_up))
        else:
            gate, up = gate_up.chunk(2, dim=-1)
            out = self.down_proj(F.silu(gate) * up)
        return out if self.tp is None else self.tp.group.all_reduce(out)


class DecoderLayer(nn.Module):
    def __init__(
        self, cfg: ModelConfig, layer_id: int, dtype: torch.dtype, device: torch.device, tp: TensorParallel | None = None
    ) -> None:
        super().__init__()
        kw = dict(dtype=dtype, device=device)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, **kw)
        self.self_attn = Attention(cfg, layer_id, dtype, device, tp)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, **kw)
        self.mlp = MLP(cfg, dtype, device, tp)

    def forward(self, h, residual, cos_sin, backend):
        """(h, residual) -> (h, residual): the residual stream is added lazily by the next norm."""
        if residual is None:
            h, residual = self.input_layernorm(h), h
        else:
            h, residual = self.input_layernorm(h, residual)
        h = self.self_attn(h, cos_sin, backend)
        h, residual = self.post_attention_layernorm(h, residual)
        return self.mlp(h), residual


class VocabParallelEmbedding(nn.Module):
    """This rank's rows of the embedding table; ids outside them look up zeros, and the
    all-reduce adds the one rank's row that holds each id."""

    def __init__(self, hidden_size: int, dtype: torch.dtype, device: torch.device, tp: TensorParallel) -> None:
        super().__init__()
        self.tp, self.start = tp, tp.plan.vocab.start
        self.weight = nn.Parameter(
            torch.empty((len(tp.plan.vocab), hidden_size), dtype=dtype, device=device), requires_grad=False
        )

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        local = input_ids - self.start
        outside = (local < 0) | (local >= self.weight.shape[0])
        h = F.embedding(local.masked_fill(outside, 0), self.weight)
        return self.tp.group.all_reduce(h.masked_fill_(outside[:, None], 0))


class DecoderModel(nn.Module):
    def __init__(self, cfg: ModelConfig, dtype: torch.dtype, device: torch.device, tp: TensorParallel | None = None) -> None:
        super().__init__()
        if tp is None:
            self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size, dtype=dtype, device=device)
            self.embed_tokens.weight.requires_grad_(False)
        else:
            self.embed_tokens = VocabParallelEmbedding(cfg.hidden_size, dtype, device, tp)
        self.layers = nn.ModuleList(DecoderLayer(cfg, i, dtype, device, tp) for i in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, dtype=dtype, device=device)
        self.rotary = RotaryEmbedding(
            cfg.head_dim, cfg.max_position_embeddings, cfg.rope_theta, cfg.rope_scaling, dtype, device
        )

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, backend: AttentionBackend) -> torch.Tensor:
        h = self.embed_tokens(input_ids)
        cos_sin = self.rotary.lookup(positions)
        residual = None
        for layer in self.layers:
            h, residual = layer(h, residual, cos_sin, backend)
        h, _ = self.norm(h, residual)
        return h


REFINED_TOP = 8  # logits per row recomputed in fp32 (see CausalLM.compute_logits)

# HF projection name -> (fused module name, shard index). Shards are stacked along dim 0 in order.
FUSED_SHARDS = {
    "q_proj": ("qkv_proj", 0), "k_proj": ("qkv_proj", 1), "v_proj": ("qkv_proj", 2),
    "gate_proj": ("gate_up_proj", 0), "up_proj": ("gate_up_proj", 1),
}


class CausalLM(nn.Module):
    """The decoder plus lm_head; architecture classes (llama.py, qwen2.py, qwen3.py) subclass it."""

    architectures: tuple[str, ...] = ()  # the HF `architectures` names a subclass serves

    def __init__(
        self, config: ModelConfig, dtype: torch.dtype, device: torch.device, tp: TensorParallel | None = None
    ) -> None:
        super().__init__()
        # `config` is the whole model's; `self.config` the shapes this rank holds (the same without tp).
        self.global_config, self.tp = config, tp
        config = config if tp is None else tp.plan.local_config(config)
        self.config, self.dtype, self.device = config, dtype, device
        self.model = DecoderModel(config, dtype, device, tp)
        head_rows = config.vocab_size if tp is None else len(tp.plan.vocab)
        self.lm_head = Linear(config.hidden_size, head_rows, dtype=dtype, device=device)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        self.is_packed = False
        # The lm_head's plain weight kept by pack(), which drops the layer's own copy (when
        # tied it is the embeddings, so nothing extra), for refining the top logits.
        self.head_weight: torch.Tensor | None = None

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, backend: AttentionBackend) -> torch.Tensor:
        """input_ids, positions: int64 [T] -> final hidden states [T, hidden] (model dtype)."""
        return self.model(input_ids, positions, backend)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [N, hidden] -> fp32 logits [N, vocab]. Pass only the rows that need logits.

        In a 16-bit dtype the lm_head's output is rounded to it: at logits of ~16 that is a step of
        0.06, as much as the margin between the top two tokens of many real answers (the default
        model's "capital of France" answer starts on a 0.1-nat tie in bf16, and flipped with
        rounding-level changes elsewhere). So the REFINED_TOP largest logits of each row are
        recomputed with fp32 accumulation and kept in fp32: greedy choices and the chosen
        tokens' log-probs follow the fp32 projection, for a top-k and a [N, k, hidden] product.

        With tp each rank refines the top of its own vocabulary slice (a superset of the global
        top), and the slices are gathered on every rank.
        """
        logits = self._local_logits(hidden)
        return logits if self.tp is None else self.tp.gather_vocab(logits, self.global_config.vocab_size)

    def _local_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = self.lm_head(hidden).float()
        weight = self.head_weight if self.head_weight is not None else self.lm_head.weight
        if hidden.dtype == torch.float32 or weight is None:
            return logits
        top = logits.topk(min(REFINED_TOP, logits.shape[1]), dim=-1).indices  # [N, k]
        rows = weight.index_select(0, top.reshape(-1)).view(*top.shape, -1).float()
        exact = torch.bmm(rows, hidden.float().unsqueeze(-1)).squeeze(-1)
        if self.lm_head.bias is not None:
            exact += self.lm_head.bias.float()[top]
        return logits.scatter_(1, top, exact)

    def use_cpu_kernels(self, kernels: ModuleType | None) -> None:
        """Run the norms, the MLP activation and the rotary through our fused C++ CPU kernels
        (None: torch ops)."""
        for module in self.modules():
            if isinstance(module, (RMSNorm, MLP, Attention)):
                module.kernels = kernels

    def quantize_int8(self) -> None:
        """Add int8 copies of the decoder's linear weights, after loading, before pack().

        The lm_head keeps full precision: its int8 error moved near-tied greedy tokens of the
        default model's chat answers (fp32: 2 of 4 prompts unchanged for 32 tokens instead of
        3), for 1.2x more single-stream speed on the AVX2 CPU.
        """
        assert not self.is_packed, "quantize_int8() must run before pack()"
        for module in self.model.modules():
            if isinstance(module, Linear):
                module.quantize_int8()

    def pack(self) -> None:
        """Prepack every linear weight for the device, once, after loading."""
        if self.dtype != torch.float32 and self.lm_head.weight is not None:
            self.head_weight = self.lm_head.weight.detach()
        for module in self.modules():
            if isinstance(module, Linear):
                module.pack()
        self.is_packed = True

    def shard_sizes(self, param_name: str, whole: bool = False) -> list[int] | None:
        """Rows of each stacked shard of a fused parameter (qkv_proj, gate_up_proj) on this rank
        (`whole`: in the whole model); None for other parameters."""
        c = self.global_config if whole else self.config
        module = param_name.split(".")[-2] if "." in param_name else ""
        if module == "qkv_proj":
            return [c.q_size, c.kv_size, c.kv_size]
        if module == "gate_up_proj":
            return [c.intermediate_size, c.intermediate_size]
        return None

    def load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Copy HF-named tensors into the (fused) parameters, casting to the model dtype.

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
            part = tensor if self.tp is None else self.tp.plan.slice_param(target, shard, tensor)
            _copy_checked(name, target, part, self._shard_view(params[target], target, shard))
        self._check_all_loaded(params, loaded)

    @torch.no_grad()
    def fill_param(self, name: str, whole: torch.Tensor) -> None:
        """Set our parameter `name` from its whole-model value (dummy weights: drawn once at the
        whole model's shapes, so every tp_size gets the same model)."""
        param = dict(self.named_parameters())[name]
        sizes = self.shard_sizes(name, whole=True)
        shards = [whole] if sizes is None else list(whole.split(sizes, dim=0))
        for shard, full in enumerate(shards):
            part = full if self.tp is None else self.tp.plan.slice_param(name, shard, full)
            self._shard_view(param, name, shard).copy_(part)

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

    def _shard_view(self, param: torch.Tensor, target: str, shard: int) -> torch.Tensor:
        sizes = self.shard_sizes(target)
        if sizes is None:
            return param.data
        return param.data.narrow(0, sum(sizes[:shard]), sizes[shard])

    def _check_all_loaded(self, params: dict[str, nn.Parameter], loaded: dict[str, set[int]]) -> None:
        missing = [name for name in params if loaded.get(name, set()) != set(range(len(self.shard_sizes(name) or [0])))]
        if missing:
            shown = ", ".join(missing[:8]) + (f" and {len(missing) - 8} more" if len(missing) > 8 else "")
            raise ValueError(f"checkpoint is missing {len(missing)} weight(s): {shown}")


def _copy_checked(name: str, target: str, tensor: torch.Tensor, dest: torch.Tensor) -> None:
    if tuple(tensor.shape) != tuple(dest.shape):
        raise ValueError(f"checkpoint tensor {name!r} has shape {tuple(tensor.shape)}, {target} expects {tuple(dest.shape)}")
    dest.copy_(tensor)
