"""The tensor-parallel partition: pure ranges (the layers that cut tensors to them are tested in
test_parallel_layers.py)."""

from __future__ import annotations

import dataclasses

import pytest

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
    assert (p0.q_rows, p0.kv_rows, p1.q_rows, p1.kv_rows) == (range(0, 12), range(0, 4), range(12, 18), range(4, 6))
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


def test_one_rank_holds_everything() -> None:
    (p,) = plans(BASE, 1)
    assert (p.q_heads, p.kv_heads, p.intermediate, p.vocab) == (range(9), range(3), range(10), range(11))
    assert p.local_config(BASE) == BASE
