"""Qwen3-MoE: Qwen3's decoder (q/k RMSNorm) whose MLP blocks are sparse mixtures of experts,
except the layers `MoeConfig.sparse_layers` leaves dense (`mlp_only_layers`, `decoder_sparse_step`).

A sparse block: the router (`mlp.gate`, a plain linear to one logit per expert) picks each token's
top-k experts (kernels/moe.py `route`, HF's rounding and tie-breaking), and every expert's SwiGLU
runs as two grouped GEMMs over the stacked expert weights (`expert_mlp`).

Checkpoints: `save_pretrained` writes one tensor per expert and projection
(`mlp.experts.{e}.gate_proj.weight`, ...), which `_target` places as shards of the stacked
parameters; transformers' in-memory layout (`mlp.experts.gate_up_proj` [E, 2I, H],
`mlp.experts.down_proj` [E, H, I]) is accepted too, split into those per-expert pieces.

Tensor parallelism splits each expert's intermediate size as the dense MLP's (Megatron's
pairing): a rank holds its slice of every expert's gate and up rows and the matching input
columns of down, and the block's output is summed by one all-reduce; the router is replicated, so
every rank routes alike. The router and experts are not `Linear`s, so weight quantization leaves
them in full precision.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator

import torch
from torch import nn

from kernels.moe import ROW_TILE, expert_mlp, route
from runtime.contracts.errors import UnsupportedModel
from runtime.contracts.model_config import ModelConfig, MoeConfig
from runtime.models.base import CausalLM, DecoderLayer, DecoderModel
from runtime.parallel.context import Collectives, ParallelContext, rank_context
from runtime.parallel.layers import ShardedWeights, check_shape
from runtime.parallel.sharding import even_split

# A per-expert checkpoint tensor: (the experts module, expert index, projection).
EXPERT_TENSOR = re.compile(r"^(.*\.mlp\.experts)\.(\d+)\.(gate_proj|up_proj|down_proj)\.weight$")
# transformers' stacked layout: (the experts module, projection).
STACKED_TENSOR = re.compile(r"^(.*\.mlp\.experts)\.(gate_up_proj|down_proj)$")


class StackedExperts(nn.Module, ShardedWeights):
    """One projection of every expert, this rank's part of it: `weight` [E, parts * len(rows),
    len(cols)]. Each expert's checkpoint matrix is `parts` blocks of `whole_rows` rows (gate and
    up: 2; down: 1) by `whole_cols` columns, of which the rank keeps `rows` of each block and
    `cols`; the checkpoint gives them one by one: shard `e * parts + p` is block p of expert e."""

    def __init__(self, num_experts: int, parts: int, whole: tuple[int, int], keep: tuple[range, range],
                 dtype: torch.dtype, device: torch.device) -> None:
        super().__init__()
        self.num_experts, self.parts, self.whole = num_experts, parts, whole
        self.rows, self.cols = keep
        weight = torch.empty((num_experts, parts * len(self.rows), len(self.cols)), dtype=dtype, device=device)
        self.weight = nn.Parameter(weight, requires_grad=False)

    @property
    def num_shards(self) -> int:
        return self.num_experts * self.parts

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor, shard: int = 0) -> None:
        expert, part = divmod(shard, self.parts)
        check_shape(loaded, self.whole)
        piece = loaded.narrow(0, self.rows.start, len(self.rows)).narrow(1, self.cols.start, len(self.cols))
        param.data[expert].narrow(0, part * len(self.rows), len(self.rows)).copy_(piece)

    def load_whole(self, param: nn.Parameter, whole: torch.Tensor) -> None:
        check_shape(whole, (self.num_experts, self.parts * self.whole[0], self.whole[1]))
        for expert, matrix in enumerate(whole):
            for part, block in enumerate(matrix.split(self.whole[0])):
                self.weight_loader(param, block, expert * self.parts + part)


class Experts(nn.Module):
    """Every expert's gate/up rows ([E, 2I, H]: gate then up) and down projection ([E, H, I]),
    cut to this rank's slice of I."""

    def __init__(self, moe: MoeConfig, hidden: int, tp: ParallelContext, dtype: torch.dtype,
                 device: torch.device) -> None:
        super().__init__()
        size, everything = moe.intermediate_size, range(hidden)
        mine = even_split(size, tp.plan.size, tp.plan.rank)
        self.gate_up = StackedExperts(moe.num_experts, 2, (size, hidden), (mine, everything), dtype, device)
        self.down = StackedExperts(moe.num_experts, 1, (hidden, size), (everything, mine), dtype, device)


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

    def __init__(self, cfg: ModelConfig, moe: MoeConfig, tp: ParallelContext, dtype: torch.dtype,
                 device: torch.device) -> None:
        super().__init__()
        self.moe = moe
        self.row_tile = ROW_TILE  # expert groups' padding (kernels/moe.py); set by the engines choice
        self.gate = Router(moe.num_experts, cfg.hidden_size, dtype, device)
        self.experts = Experts(moe, cfg.hidden_size, tp, dtype, device)
        self.group: Collectives = tp.group

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        routing = route(self.gate(h), self.moe.top_k, self.moe.norm_topk_prob)
        out = expert_mlp(h, routing, self.experts.gate_up.weight, self.experts.down.weight, self.row_tile)
        return self.group.all_reduce(out)  # each rank's slice of I gave a partial sum


class Qwen3MoeForCausalLM(CausalLM):
    architectures = ("Qwen3MoeForCausalLM",)

    def __init__(
        self, config: ModelConfig, dtype: torch.dtype, device: torch.device, tp: ParallelContext | None = None
    ) -> None:
        super().__init__(config, dtype, device, tp)
        parallel = rank_context(tp, config)
        moe = config.moe
        assert moe is not None, "ModelConfig.from_hf sets moe for this architecture"
        # The shared decoder built dense MLPs (torch.empty: unwritten memory); swap in the sparse
        # blocks. NOTE: Qwen3's q/k norms keep these layers off the GGUF decode stack
        # (DecoderLayer.block_layer), which would read a dense MLP's linears.
        decoder = self.model
        assert isinstance(decoder, DecoderModel), "Qwen3-MoE runs on the shared decoder"
        for i in moe.sparse_layers:
            layer = decoder.layers[i]
            assert isinstance(layer, DecoderLayer) and layer.self_attn.qk_norm
            layer.add_module("mlp", SparseMoeBlock(config, moe, parallel, dtype, device))

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
