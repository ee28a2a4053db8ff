"""Which part of the model each tensor-parallel rank holds, as ranges of global indices.

Megatron's layout, as SGLang and vLLM use it:
  - qkv_proj and gate_up_proj are column-parallel: a rank holds the rows of its heads (q rows of
    its query heads, k and v rows of its KV heads) and of its slice of the intermediate size;
  - o_proj and down_proj are row-parallel: a rank holds the matching input columns, and the
    partial outputs are summed by one all-reduce each (their bias is added by rank 0 alone);
  - embed_tokens and lm_head are vocab-parallel: a rank holds a contiguous slice of the vocabulary;
  - a mixture of experts' blocks: every expert's gate/up and down split like the dense MLP's, over
    the expert's own intermediate size (runtime/models/qwen3_moe.py), the router replicated.

Heads follow their KV head: a query head always lives on a rank that holds its KV head. With at
least as many KV heads as ranks, the KV heads are split into contiguous near-even ranges (the
first ranks take one more when they do not divide), so the default model's 9 query / 3 KV heads
split 6+3 over two ranks; SGLang requires even splits and would refuse it. With fewer KV heads
than ranks, each KV head is replicated on `size // num_kv_heads` ranks that split its query heads.

Pure Python over ranges, no torch: the parallel layers (runtime/parallel/layers.py) cut the
checkpoint's tensors to these ranges when they load them.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from runtime.contracts.errors import InvalidRequest
from runtime.contracts.model_config import ModelConfig


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

    @property
    def q_rows(self) -> range:
        """This rank's rows of q in qkv_proj, which are also its input columns of o_proj."""
        return range(self.q_heads.start * self.head_dim, self.q_heads.stop * self.head_dim)

    @property
    def kv_rows(self) -> range:
        """This rank's rows of k (and of v) in qkv_proj."""
        return range(self.kv_heads.start * self.head_dim, self.kv_heads.stop * self.head_dim)


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
    experts = cfg.moe.intermediate_size if cfg.moe is not None and cfg.moe.sparse_layers else size
    if size > cfg.intermediate_size or size > cfg.vocab_size or size > experts:
        raise InvalidRequest(f"tp_size {size} is larger than the model's dimensions", param="tp_size")
