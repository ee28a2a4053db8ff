"""Which part of the model each tensor-parallel rank holds, and how a full tensor is cut for it.

Megatron's layout, as SGLang and vLLM use it:
  - qkv_proj and gate_up_proj are column-parallel: a rank holds the rows of its heads (q rows of
    its query heads, k and v rows of its KV heads) and of its slice of the intermediate size;
  - o_proj and down_proj are row-parallel: a rank holds the matching input columns, and the
    partial outputs are summed by one all-reduce each (their bias is added by rank 0 alone);
  - embed_tokens and lm_head are vocab-parallel: a rank holds a contiguous slice of the vocabulary.

Heads follow their KV head: a query head always lives on a rank that holds its KV head. With at
least as many KV heads as ranks, the KV heads are split into contiguous near-even ranges (the
first ranks take one more when they do not divide), so the default model's 9 query / 3 KV heads
split 6+3 over two ranks; SGLang requires even splits and would refuse it. With fewer KV heads
than ranks, each KV head is replicated on `size // num_kv_heads` ranks that split its query heads.

Pure Python over ranges; `slice_param` is the only function that touches tensors.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from runtime.contracts.errors import InvalidRequest
from runtime.contracts.model_config import ModelConfig

if TYPE_CHECKING:
    import torch


def even_split(total: int, parts: int, index: int) -> range:
    """The `index`-th of `parts` contiguous near-even ranges of range(total) (first ones larger)."""
    base, extra = divmod(total, parts)
    start = index * base + min(index, extra)
    return range(start, start + base + (1 if index < extra else 0))


@dataclass(frozen=True)
class ShardPlan:
    """Rank `rank` of `size`: the global indices of what it holds."""

    rank: int
    size: int
    q_heads: range
    kv_heads: range
    intermediate: range
    vocab: range
    vocab_stride: int  # the largest rank's vocab slice: logits are gathered padded to it
    head_dim: int

    @classmethod
    def build(cls, cfg: ModelConfig, size: int, rank: int) -> ShardPlan:
        check_shardable(cfg, size)
        group = cfg.num_heads // cfg.num_kv_heads
        if cfg.num_kv_heads >= size:
            kv = even_split(cfg.num_kv_heads, size, rank)
            q = range(kv.start * group, kv.stop * group)
        else:  # replicate: `copies` ranks share each KV head and split its query heads
            copies = size // cfg.num_kv_heads
            head = rank // copies
            kv = range(head, head + 1)
            part = even_split(group, copies, rank % copies)
            q = range(head * group + part.start, head * group + part.stop)
        return cls(
            rank=rank,
            size=size,
            q_heads=q,
            kv_heads=kv,
            intermediate=even_split(cfg.intermediate_size, size, rank),
            vocab=even_split(cfg.vocab_size, size, rank),
            vocab_stride=-(-cfg.vocab_size // size),
            head_dim=cfg.head_dim,
        )

    def local_config(self, cfg: ModelConfig) -> ModelConfig:
        """The shapes this rank computes with (the vocabulary stays global: the sampler's)."""
        return replace(
            cfg, num_heads=len(self.q_heads), num_kv_heads=len(self.kv_heads),
            intermediate_size=len(self.intermediate),
        )

    def slice_param(self, name: str, shard: int, full: torch.Tensor) -> torch.Tensor:
        """This rank's part of `full`, the whole tensor (or one fused shard: q/k/v of qkv_proj,
        gate/up of gate_up_proj) of our parameter `name`."""
        module, kind = _module_and_kind(name)
        d = self.head_dim
        if module == "qkv_proj":
            heads = self.q_heads if shard == 0 else self.kv_heads
            return full.narrow(0, heads.start * d, len(heads) * d)
        if module == "gate_up_proj":
            return _narrow(full, 0, self.intermediate)
        if module in ("o_proj", "down_proj"):
            if kind == "bias":  # added once, after the all-reduce sums the partial outputs
                return full if self.rank == 0 else full.new_zeros(full.shape)
            cols = range(self.q_heads.start * d, self.q_heads.stop * d) if module == "o_proj" else self.intermediate
            return _narrow(full, 1, cols)
        if module in ("embed_tokens", "lm_head"):
            return _narrow(full, 0, self.vocab)
        return full  # norms: replicated


def _narrow(t: torch.Tensor, dim: int, part: range) -> torch.Tensor:
    return t.narrow(dim, part.start, len(part))


def _module_and_kind(name: str) -> tuple[str, str]:
    parts = name.split(".")
    return (parts[-2] if len(parts) >= 2 else "", parts[-1])


def check_shardable(cfg: ModelConfig, size: int) -> None:
    """Refuse, naming tp_size, a split that leaves a rank without heads or a KV head unplaceable."""
    if size < 1:
        raise InvalidRequest("tp_size must be >= 1", param="tp_size")
    if size > cfg.num_heads:
        raise InvalidRequest(f"tp_size {size} exceeds the model's {cfg.num_heads} attention heads", param="tp_size")
    if cfg.num_kv_heads < size:
        group = cfg.num_heads // cfg.num_kv_heads
        if size % cfg.num_kv_heads or size // cfg.num_kv_heads > group:
            raise InvalidRequest(
                f"tp_size {size} does not fit the model's {cfg.num_kv_heads} KV heads: with fewer KV heads "
                f"than ranks, tp_size must be a multiple of them and at most {cfg.num_heads}",
                param="tp_size",
            )
    if size > cfg.intermediate_size or size > cfg.vocab_size:
        raise InvalidRequest(f"tp_size {size} is larger than the model's dimensions", param="tp_size")
