"""The tensor-parallel partition (pure ranges) and the cutting of whole tensors into rank parts."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from runtime.contracts.errors import InvalidRequest
from runtime.contracts.model_config import ModelConfig
from runtime.parallel.sharding import ShardPlan, check_shardable, even_split

BASE = ModelConfig(
    architecture="LlamaForCausalLM", hidden_size=16, intermediate_size=10, num_layers=1, num_heads=9,
    num_kv_heads=3, head_dim=2, vocab_size=11, rms_norm_eps=1e-6, rope_theta=1e4, rope_scaling=None,
    max_position_embeddings=64, tie_word_embeddings=False, qkv_bias=True, o_bias=True, mlp_bias=False,
    qk_norm=False, torch_dtype=None, eos_token_ids=(),
)


def shape(**changes) -> ModelConfig:
    return dataclasses.replace(BASE, **changes)


def plans(cfg: ModelConfig, size: int) -> list[ShardPlan]:
    return [ShardPlan.build(cfg, size, r) for r in range(size)]


def test_even_split_covers_the_range_in_order() -> None:
    assert [even_split(10, 3, i) for i in range(3)] == [range(0, 4), range(4, 7), range(7, 10)]
    assert [len(even_split(49152, 2, i)) for i in range(2)] == [24576, 24576]


def test_default_model_shape_splits_by_kv_head() -> None:
    """9 query / 3 KV heads over 2 ranks: KV heads 2 + 1, each query head beside its KV head."""
    p0, p1 = plans(BASE, 2)
    assert (p0.kv_heads, p0.q_heads) == (range(0, 2), range(0, 6))
    assert (p1.kv_heads, p1.q_heads) == (range(2, 3), range(6, 9))
    assert p0.vocab_stride == 6 and (p0.vocab, p1.vocab) == (range(0, 6), range(6, 11))
    local = p1.local_config(BASE)
    assert (local.num_heads, local.num_kv_heads, local.intermediate_size, local.vocab_size) == (3, 1, 5, 11)


def test_fewer_kv_heads_than_ranks_replicates_them() -> None:
    cfg = shape(num_heads=8, num_kv_heads=2)
    got = [(p.kv_heads, p.q_heads) for p in plans(cfg, 4)]
    assert got == [(range(0, 1), range(0, 2)), (range(0, 1), range(2, 4)),
                   (range(1, 2), range(4, 6)), (range(1, 2), range(6, 8))]


@pytest.mark.parametrize("changes,size", [({}, 10), ({"num_heads": 8, "num_kv_heads": 2}, 3),
                                           ({"num_heads": 4, "num_kv_heads": 1}, 8), ({}, 0)])
def test_impossible_splits_name_tp_size(changes: dict, size: int) -> None:
    with pytest.raises(InvalidRequest) as err:
        check_shardable(shape(**changes), size)
    assert err.value.param == "tp_size"


def test_column_parts_concatenate_to_the_whole() -> None:
    d, cfg = BASE.head_dim, BASE
    q = torch.randn(cfg.num_heads * d, 16)
    k = torch.randn(cfg.num_kv_heads * d, 16)
    ps = plans(cfg, 2)
    assert torch.equal(torch.cat([p.slice_param("l.qkv_proj.weight", 0, q) for p in ps]), q)
    assert torch.equal(torch.cat([p.slice_param("l.qkv_proj.weight", 1, k) for p in ps]), k)
    up = torch.randn(cfg.intermediate_size, 16)
    assert torch.equal(torch.cat([p.slice_param("l.gate_up_proj.weight", 1, up) for p in ps]), up)
    emb = torch.randn(cfg.vocab_size, 16)
    assert torch.equal(torch.cat([p.slice_param("model.embed_tokens.weight", 0, emb) for p in ps]), emb)


def test_row_parallel_partial_products_sum_to_the_whole() -> None:
    """o_proj: each rank multiplies its heads' columns; the all-reduce's sum is the full product,
    with the bias counted once (rank 0's)."""
    x = torch.randn(3, BASE.num_heads * BASE.head_dim, dtype=torch.float64)
    w = torch.randn(16, BASE.num_heads * BASE.head_dim, dtype=torch.float64)
    b = torch.randn(16, dtype=torch.float64)
    total = torch.zeros(3, 16, dtype=torch.float64)
    for p in plans(BASE, 2):
        cols = range(p.q_heads.start * BASE.head_dim, p.q_heads.stop * BASE.head_dim)
        x_local = x[:, cols.start : cols.stop]
        total += x_local @ p.slice_param("l.o_proj.weight", 0, w).T + p.slice_param("l.o_proj.bias", 0, b)
    assert torch.allclose(total, x @ w.T + b)


def test_norms_are_replicated() -> None:
    norm = torch.randn(16)
    assert all(p.slice_param("model.layers.0.input_layernorm.weight", 0, norm) is norm for p in plans(BASE, 2))
