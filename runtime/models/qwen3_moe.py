"""Qwen3-MoE: Qwen3's decoder (q/k RMSNorm) whose MLP blocks are sparse mixtures of experts,
except the layers `MoeConfig.sparse_layers` leaves dense (`mlp_only_layers`, `decoder_sparse_step`).

A sparse block: the router (`mlp.gate`, a plain linear to one logit per expert) picks each token's
top-k experts (kernels/moe.py `route`, HF's rounding and tie-breaking), and every expert's SwiGLU
runs as two grouped GEMMs over the stacked expert weights (`expert_mlp`).

Checkpoints: `save_pretrained` writes one tensor per expert and projection
(`mlp.experts.{e}.gate_proj.weight`, ...), which `_target` places as shards of the stacked
parameters; transformers' in-memory layout (`mlp.experts.gate_up_proj` [E, 2I, H],
`mlp.experts.down_proj` [E, H, I]) is accepted too, split into those per-expert pieces.

Tensor parallelism is refused for these models (`runtime/parallel/sharding.py check_shardable`);
the router and experts are not `Linear`s, so weight quantization leaves them in full precision.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator

import torch
from torch import nn

from kernels.moe import ROW_TILE, expert_mlp, route
from runtime.contracts.errors import UnsupportedModel
from runtime.contracts.model_config import ModelConfig, MoeConfig
from runtime.models.base import CausalLM, DecoderLayer
from runtime.parallel.context import ParallelContext
from runtime.parallel.layers import ShardedWeights, check_shape

# A per-expert checkpoint tensor: (the experts module, expert index, projection).
EXPERT_TENSOR = re.compile(r"^(.*\.mlp\.experts)\.(\d+)\.(gate_proj|up_proj|down_proj)\.weight$")
# transformers' stacked layout: (the experts module, projection).
STACKED_TENSOR = re.compile(r"^(.*\.mlp\.experts)\.(gate_up_proj|down_proj)$")


class StackedExperts(nn.Module, ShardedWeights):
    """One projection of every expert, `weight` [E, sum(part_rows), cols]; the checkpoint gives
    each expert's parts one by one: shard `e * len(part_rows) + p` is part p of expert e."""

    def __init__(self, num_experts: int, part_rows: tuple[int, ...], cols: int, dtype: torch.dtype,
                 device: torch.device) -> None:
        super().__init__()
        self.part_rows, self.num_experts = part_rows, num_experts
        weight = torch.empty((num_experts, sum(part_rows), cols), dtype=dtype, device=device)
        self.weight = nn.Parameter(weight, requires_grad=False)

    @property
    def num_shards(self) -> int:
        return self.num_experts * len(self.part_rows)

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor, shard: int = 0) -> None:
        expert, part = divmod(shard, len(self.part_rows))
        check_shape(loaded, (self.part_rows[part], param.shape[2]))
        param.data[expert].narrow(0, sum(self.part_rows[:part]), self.part_rows[part]).copy_(loaded)

    def load_whole(self, param: nn.Parameter, whole: torch.Tensor) -> None:
        check_shape(whole, param.shape)
        param.data.copy_(whole)


class Experts(nn.Module):
    """Every expert's gate/up rows ([E, 2I, H]: gate then up) and down projection ([E, H, I])."""

    def __init__(self, moe: MoeConfig, hidden: int, dtype: torch.dtype, device: torch.device) -> None:
        super().__init__()
        size = moe.intermediate_size
        self.gate_up = StackedExperts(moe.num_experts, (size, size), hidden, dtype, device)
        self.down = StackedExperts(moe.num_experts, (hidden,), size, dtype, device)


class Router(nn.Module):
    """One logit per expert, by F.linear in the model dtype as HF computes them: the routing is a
    discrete choice, so it stays unquantized and on the same op as the reference."""

    def __init__(self, num_experts: int, hidden: int, dtype: torch.dtype, device: torch.device) -> None:
        super().__init__()
        weight = torch.empty((num_experts, hidden), dtype=dtype, device=device)
        self.weight = nn.Parameter(weight, requires_grad=False)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.linear(h, self.weight)


class SparseMoeBlock(nn.Module):
    """The router, then each token's top-k experts, their outputs summed by routing weight."""

    def __init__(self, cfg: ModelConfig, moe: MoeConfig, dtype: torch.dtype, device: torch.device) -> None:
        super().__init__()
        self.moe = moe
        self.row_tile = ROW_TILE  # expert groups' padding (kernels/moe.py); set by the engines choice
        self.gate = Router(moe.num_experts, cfg.hidden_size, dtype, device)
        self.experts = Experts(moe, cfg.hidden_size, dtype, device)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        routing = route(self.gate(h), self.moe.top_k, self.moe.norm_topk_prob)
        return expert_mlp(h, routing, self.experts.gate_up.weight, self.experts.down.weight, self.row_tile)


class Qwen3MoeForCausalLM(CausalLM):
    architectures = ("Qwen3MoeForCausalLM",)

    def __init__(
        self, config: ModelConfig, dtype: torch.dtype, device: torch.device, tp: ParallelContext | None = None
    ) -> None:
        if tp is not None and tp.plan.size > 1:
            raise UnsupportedModel("Qwen3MoeForCausalLM runs on one rank only (tensor parallelism is not supported)")
        super().__init__(config, dtype, device, tp)
        moe = config.moe
        assert moe is not None, "ModelConfig.from_hf sets moe for this architecture"
        # The shared decoder built dense MLPs (torch.empty: unwritten memory); swap in the sparse
        # blocks. NOTE: Qwen3's q/k norms keep these layers off the GGUF decode stack
        # (DecoderLayer.block_layer), which would read a dense MLP's linears.
        for i in moe.sparse_layers:
            layer = self.model.layers[i]
            assert isinstance(layer, DecoderLayer) and layer.self_attn.qk_norm
            layer.add_module("mlp", SparseMoeBlock(config, moe, dtype, device))

    def load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        super().load_weights(self._split_stacked(named_tensors))

    def _split_stacked(self, named_tensors: Iterable[tuple[str, torch.Tensor]]
                       ) -> Iterator[tuple[str, torch.Tensor]]:
        """transformers' stacked expert tensors as the per-expert ones; others as they are."""
        for name, tensor in named_tensors:
            match = STACKED_TENSOR.match(name)
            if match is None:
                yield name, tensor
                continue
            prefix, proj = match.groups()
            if tensor.dim() != 3:
                raise ValueError(f"checkpoint tensor {name!r} has shape {tuple(tensor.shape)}, expected [E, N, K]")
            for e, piece in enumerate(tensor):
                if proj == "down_proj":
                    yield f"{prefix}.{e}.down_proj.weight", piece
                    continue
                if piece.shape[0] % 2:
                    raise ValueError(f"checkpoint tensor {name!r} has {piece.shape[0]} gate+up rows, not an even count")
                gate, up = piece.chunk(2, dim=0)
                yield f"{prefix}.{e}.gate_proj.weight", gate
                yield f"{prefix}.{e}.up_proj.weight", up

    def _target(self, name: str, params: dict[str, nn.Parameter]) -> tuple[str, int]:
        """A per-expert tensor is a shard of its layer's stacked parameter; others as the base maps them."""
        match = EXPERT_TENSOR.match(name)
        if match is None:
            return super()._target(name, params)
        prefix, expert, proj = match.group(1), int(match.group(2)), match.group(3)
        target = f"{prefix}.down.weight" if proj == "down_proj" else f"{prefix}.gate_up.weight"
        moe = self.config.moe
        if target not in params or moe is None or expert >= moe.num_experts:
            raise UnsupportedModel(f"checkpoint tensor {name!r} has no place in {self.config.architecture}")
        return target, expert if proj == "down_proj" else 2 * expert + (proj == "up_proj")
