"""The layers the models are built from, as in nano-vllm: linear, embedding and lm_head layers
that each hold this rank's shard of a whole-model matrix, load that shard from the checkpoint's
whole tensors (`weight_loader`) and run their own collective. On a single rank (`SingleRankContext`)
the shard is the whole matrix and the collective an identity, so a model built from these layers
has no tensor-parallel branches.

Megatron's pairing: a column-parallel layer (output rows split, no collective) feeds a
row-parallel one (input columns split) whose partial products one all-reduce sums.

    qkv_proj [q | k | v] rows     one rank's output rows (QKVParallelLinear, fused shards 0, 1, 2):
      q: q_size rows  ─────────►   q_rows of q    (this rank's query heads)
      k: kv_size rows ─────────►   kv_rows of k   (its KV heads)
      v: kv_size rows ─────────►   kv_rows of v
    stacked on this rank as [len(q_rows) | len(kv_rows) | len(kv_rows)].

Quantization is orthogonal: every class here is a `kernels.linear.Linear`, whose product method
(`Int8LinearMethod` or the dense one) is swapped in at load.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from kernels.gguf_blocks import BlockFormat, dequantize
from kernels.linear import Linear
from runtime.parallel.context import Collectives, ParallelContext
from runtime.parallel.sharding import even_split


def check_shape(loaded: torch.Tensor, want: Sequence[int]) -> None:
    """Raise ValueError when a checkpoint tensor is not the whole-model shape a layer expects."""
    if tuple(loaded.shape) != tuple(want):
        raise ValueError(f"has shape {tuple(loaded.shape)}, expected {tuple(want)}")


def load_replicated(param: nn.Parameter, loaded: torch.Tensor) -> None:
    """The loader of a parameter every rank holds whole (norms)."""
    check_shape(loaded, param.shape)
    param.data.copy_(loaded)


class ShardedWeights:
    """A module whose parameters hold this rank's part of whole-model tensors.

    A fused parameter stacks several checkpoint tensors along dim 0 (`fused_sizes`: their
    whole-model rows, in order); the checkpoint gives them one by one, as shards 0, 1, ...
    """

    fused_sizes: tuple[int, ...] = ()  # empty: one checkpoint tensor per parameter

    @property
    def num_shards(self) -> int:
        return max(1, len(self.fused_sizes))

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor, shard: int = 0) -> None:
        """Copy this rank's part of `loaded` (the whole checkpoint tensor, or shard `shard` of a
        fused parameter) into `param`, casting to its dtype. Raises ValueError on a shape mismatch."""
        raise NotImplementedError

    def load_whole(self, param: nn.Parameter, whole: torch.Tensor) -> None:
        """Load `param` from its whole-model value, every fused shard at once (dummy weights)."""
        pieces = whole.split(list(self.fused_sizes)) if self.fused_sizes else [whole]
        for shard, piece in enumerate(pieces):
            self.weight_loader(param, piece, shard)


class ColumnParallelLinear(Linear, ShardedWeights):
    """Output rows split over the ranks: one or more whole matrices (`output_sizes` rows each,
    stacked, e.g. gate and up) each cut to this rank's `parts` (default: near-even splits).
    No collective: a row-parallel layer consumes the split output."""

    def __init__(
        self, input_size: int, output_sizes: Sequence[int], bias: bool, tp: ParallelContext,
        dtype: torch.dtype, device: torch.device, parts: Sequence[range] | None = None,
    ) -> None:
        plan = tp.plan
        if parts is None:
            parts = [even_split(n, plan.size, plan.rank) for n in output_sizes]
        assert len(parts) == len(output_sizes), "one part per stacked matrix"
        super().__init__(input_size, sum(len(p) for p in parts), bias, dtype, device)
        self.parts, self.fused_sizes = list(parts), tuple(output_sizes)

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor, shard: int = 0) -> None:
        part = self.parts[shard]
        check_shape(loaded, (self.fused_sizes[shard], *param.shape[1:]))
        offset = sum(len(p) for p in self.parts[:shard])
        param.data.narrow(0, offset, len(part)).copy_(loaded.narrow(0, part.start, len(part)))


class QKVParallelLinear(ColumnParallelLinear):
    """The fused q, k, v projection, split by heads as the plan places them (see the diagram)."""

    def __init__(
        self, hidden_size: int, head_dim: int, num_heads: int, num_kv_heads: int, bias: bool,
        tp: ParallelContext, dtype: torch.dtype, device: torch.device,
    ) -> None:
        plan = tp.plan
        assert plan.head_dim == head_dim, "the plan places heads of this size"
        q, kv = num_heads * head_dim, num_kv_heads * head_dim
        super().__init__(hidden_size, [q, kv, kv], bias, tp, dtype, device,
                         parts=[plan.q_rows, plan.kv_rows, plan.kv_rows])


class RowParallelLinear(Linear, ShardedWeights):
    """Input columns split over the ranks (`input_part`, default a near-even split); one
    all-reduce sums the partial products.

    NOTE: the bias is added once: rank 0 holds it and the other ranks hold zeros, so the sum
    counts it once whichever path (packed, int8, F.linear) adds it.
    """

    def __init__(
        self, input_size: int, output_size: int, bias: bool, tp: ParallelContext,
        dtype: torch.dtype, device: torch.device, input_part: range | None = None,
    ) -> None:
        plan = tp.plan
        part = input_part if input_part is not None else even_split(input_size, plan.size, plan.rank)
        super().__init__(len(part), output_size, bias, dtype, device)
        self.part, self.input_size, self.rank = part, input_size, plan.rank
        self.group: Collectives = tp.group

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor, shard: int = 0) -> None:
        if param is self.bias:
            check_shape(loaded, param.shape)
            param.data.copy_(loaded if self.rank == 0 else torch.zeros_like(loaded))
            return
        check_shape(loaded, (self.out_features, self.input_size))
        param.data.copy_(loaded.narrow(1, self.part.start, len(self.part)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.group.all_reduce(super().forward(x))


class VocabParallelEmbedding(nn.Module, ShardedWeights):
    """This rank's contiguous rows of the embedding table (`part`, a near-even split of the
    vocabulary). An id outside them looks up zeros, and the all-reduce adds the one rank's row
    that holds each id. A single rank holds every row: a plain lookup, nothing masked."""

    def __init__(
        self, vocab_size: int, hidden_size: int, tp: ParallelContext, dtype: torch.dtype, device: torch.device
    ) -> None:
        super().__init__()
        plan = tp.plan
        self.vocab_size, self.part, self.size = vocab_size, even_split(vocab_size, plan.size, plan.rank), plan.size
        self.group: Collectives = tp.group
        weight = torch.empty((len(self.part), hidden_size), dtype=dtype, device=device)
        self.weight = nn.Parameter(weight, requires_grad=False)
        self.blocks: torch.Tensor | None = None  # use_blocks: the table as GGUF block rows
        self.block_format: BlockFormat | None = None

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor, shard: int = 0) -> None:
        check_shape(loaded, (self.vocab_size, param.shape[1]))
        param.data.copy_(loaded.narrow(0, self.part.start, len(self.part)))

    def use_blocks(self, rows: torch.Tensor, fmt: BlockFormat) -> None:
        """Look ids up in GGUF block rows [vocab, bytes] (one rank), decoding only the rows looked
        up, to the values a dequantized table holds; the table itself is dropped."""
        assert self.size == 1 and rows.shape[0] == self.vocab_size, "block lookups run on one rank"
        self.blocks, self.block_format = rows, fmt
        self.weight = nn.Parameter(self.weight.new_empty((0, self.weight.shape[1])), requires_grad=False)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        if self.blocks is not None and self.block_format is not None:
            return dequantize(self.blocks[input_ids], self.block_format).to(self.weight.dtype)
        if self.size == 1:
            return nn.functional.embedding(input_ids, self.weight)
        local = input_ids - self.part.start
        outside = (local < 0) | (local >= len(self.part))
        h = nn.functional.embedding(local.masked_fill(outside, 0), self.weight)
        return self.group.all_reduce(h.masked_fill_(outside[:, None], 0))


REFINED_TOP = 8  # logits per row recomputed in fp32 (see ParallelLMHead.forward)


class ParallelLMHead(Linear, ShardedWeights):
    """The output projection over this rank's vocabulary rows (the embedding's split), with the
    slices gathered so every rank returns the whole vocabulary's logits."""

    def __init__(
        self, vocab_size: int, hidden_size: int, tp: ParallelContext, dtype: torch.dtype, device: torch.device
    ) -> None:
        plan = tp.plan
        part = even_split(vocab_size, plan.size, plan.rank)
        super().__init__(hidden_size, len(part), bias=False, dtype=dtype, device=device)
        self.vocab_size, self.part, self.size = vocab_size, part, plan.size
        self.group: Collectives = tp.group
        # The plain weight kept by pack(), which drops the layer's own copy (when tied it is the
        # embeddings, so nothing extra), for refining the top logits.
        self.plain_weight: torch.Tensor | None = None

    def tie(self, embedding: VocabParallelEmbedding) -> None:
        """Share the embedding table (the same vocabulary rows on this rank)."""
        assert embedding.part == self.part, "the head and the embeddings split the vocabulary alike"
        self.weight = embedding.weight

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor, shard: int = 0) -> None:
        check_shape(loaded, (self.vocab_size, self.in_features))
        param.data.copy_(loaded.narrow(0, self.part.start, len(self.part)))

    def pack(self) -> None:
        if self.packed is None and self.weight is not None and self.weight.dtype != torch.float32:
            self.plain_weight = self.weight.detach()
        super().pack()

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [N, hidden] -> fp32 logits [N, vocab] on every rank.

        In a 16-bit dtype the projection's output is rounded to it: at logits of ~16 that is a
        step of 0.06, as much as the margin between the top two tokens of many real answers (the
        default model's "capital of France" answer starts on a 0.1-nat tie in bf16, and flipped
        with rounding-level changes elsewhere). So the REFINED_TOP largest logits of each row are
        recomputed with fp32 accumulation and kept in fp32: greedy choices and the chosen tokens'
        log-probs follow the fp32 projection, for a top-k and a [N, k, hidden] product. Each rank
        refines the top of its own slice (a superset of the global top) before the gather.
        """
        if not self.method.full_precision:  # quantized blocks: fp32 in, fp32 out, nothing to refine
            return self._gather(super().forward(hidden.float()))
        return self._gather(self._refined(hidden, super().forward(hidden).float()))

    def _refined(self, hidden: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        weight = self.plain_weight if self.plain_weight is not None else self.weight
        if hidden.dtype == torch.float32 or weight is None:
            return logits
        top = logits.topk(min(REFINED_TOP, logits.shape[1]), dim=-1).indices  # [N, k]
        rows = weight.index_select(0, top.reshape(-1)).view(*top.shape, -1).float()
        exact = torch.bmm(rows, hidden.float().unsqueeze(-1)).squeeze(-1)
        return logits.scatter_(1, top, exact)

    def _gather(self, local: torch.Tensor) -> torch.Tensor:
        """[N, local vocab] on each rank -> [N, vocab]: the slices padded to the widest (rank
        0's) for the gather, then trimmed."""
        if self.size == 1:
            return local
        widths = [len(even_split(self.vocab_size, self.size, r)) for r in range(self.size)]
        padded = nn.functional.pad(local, (0, widths[0] - local.shape[1]))
        parts = self.group.all_gather(padded)
        return torch.cat([parts[r, :, :w] for r, w in enumerate(widths)], dim=1)
