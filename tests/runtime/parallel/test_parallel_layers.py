"""The parallel layers on 1, 2 and 3 ranks against the whole-model computation.

Ranks run as threads of this process, joined by `ThreadGroup` (the collectives' sum and gather in
rank order), so each layer's own sharding, loading and collective run as they do between
processes; the weights are float64 so the comparisons are exact up to summation order.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

import pytest
import torch
import torch.nn.functional as F

from kernels.linear import DENSE, INT8_MAX_ROWS, Int8LinearMethod, quantize_int8
from runtime.parallel.context import ParallelContext, SingleRankContext, rank_context
from runtime.parallel.layers import (
    ColumnParallelLinear,
    ParallelLMHead,
    QKVParallelLinear,
    RowParallelLinear,
    VocabParallelEmbedding,
)
from runtime.parallel.sharding import ShardPlan
from tests.runtime.parallel.test_sharding import BASE

CPU = torch.device("cpu")
F64 = torch.float64
T = TypeVar("T")


class ThreadGroup:
    """The collectives of `size` ranks running as threads: each publishes its tensor, all wait,
    each reads every rank's, all wait again before the slots are reused."""

    def __init__(self, size: int) -> None:
        self.size, self.slots = size, [torch.empty(0)] * size
        self.barrier = threading.Barrier(size)

    def member(self, rank: int) -> _Member:
        return _Member(self, rank)


@dataclasses.dataclass
class _Member:
    group: ThreadGroup
    rank: int

    def all_gather(self, x: torch.Tensor) -> torch.Tensor:
        self.group.slots[self.rank] = x.clone()
        self.group.barrier.wait()
        out = torch.stack(self.group.slots)
        self.group.barrier.wait()
        return out

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        return x.copy_(self.all_gather(x).sum(0))


@dataclasses.dataclass(frozen=True)
class RankContext:
    plan: ShardPlan
    group: _Member


def on_ranks(size: int, fn: Callable[[ParallelContext], T]) -> list[T]:
    """fn(context) on every rank of a `size`-rank group of BASE, concurrently; results in rank order."""
    group = ThreadGroup(size)
    contexts = [RankContext(ShardPlan.build(BASE, size, r), group.member(r)) for r in range(size)]
    with ThreadPoolExecutor(size) as pool:
        return list(pool.map(fn, contexts))


def p(layer: torch.nn.Module, name: str) -> torch.nn.Parameter:
    """A layer's parameter (`weight`/`bias` of a Linear are typed optional: pack() drops one)."""
    return layer.get_parameter(name)


def randn(*shape: int, seed: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=F64)


H, D, N, V = BASE.hidden_size, BASE.head_dim, BASE.intermediate_size, BASE.vocab_size
Q, KV = BASE.num_heads * D, BASE.num_kv_heads * D
WQ, WK, WV, WO = randn(Q, H, seed=1), randn(KV, H, seed=2), randn(KV, H, seed=3), randn(H, Q, seed=4)
BQ, BK, BV, BO = randn(Q, seed=5), randn(KV, seed=6), randn(KV, seed=7), randn(H, seed=8)
X = randn(5, H, seed=9)


def attention_projections(tp: ParallelContext) -> torch.Tensor:
    """qkv -> (this rank's q) -> o_proj: what Attention does around the backend."""
    qkv = QKVParallelLinear(H, D, BASE.num_heads, BASE.num_kv_heads, True, tp, F64, CPU)
    for shard, (w, b) in enumerate([(WQ, BQ), (WK, BK), (WV, BV)]):
        qkv.weight_loader(p(qkv, "weight"), w, shard)
        qkv.weight_loader(p(qkv, "bias"), b, shard)
    o_proj = RowParallelLinear(Q, H, True, tp, F64, CPU, input_part=tp.plan.q_rows)
    o_proj.weight_loader(p(o_proj, "weight"), WO)
    o_proj.weight_loader(p(o_proj, "bias"), BO)
    q = qkv(X)[:, : len(tp.plan.q_rows)]
    return o_proj(q)


@pytest.mark.parametrize("size", [1, 2, 3])
def test_column_then_row_parallel_equals_the_whole_product(size: int) -> None:
    """Each rank's q rows feed its o_proj columns; the all-reduce sums to the full product, with
    the row-parallel bias counted once."""
    want = (X @ WQ.T + BQ) @ WO.T + BO
    for got in on_ranks(size, attention_projections):
        assert torch.allclose(got, want)


def test_qkv_rows_are_the_plans_heads() -> None:
    def local_weight(tp: ParallelContext) -> torch.Tensor:
        qkv = QKVParallelLinear(H, D, BASE.num_heads, BASE.num_kv_heads, False, tp, F64, CPU)
        qkv.load_whole(p(qkv, "weight"), torch.cat([WQ, WK, WV]))  # all three shards from one tensor
        return p(qkv, "weight").detach()

    w0, w1 = on_ranks(2, local_weight)  # q heads 0-5 + kv heads 0-1; q heads 6-8 + kv head 2
    assert torch.equal(w0, torch.cat([WQ[:12], WK[:4], WV[:4]]))
    assert torch.equal(w1, torch.cat([WQ[12:], WK[4:], WV[4:]]))


@pytest.mark.parametrize("size", [1, 2])
def test_merged_gate_up_and_down(size: int) -> None:
    gate, up, down = randn(N, H, seed=10), randn(N, H, seed=11), randn(H, N, seed=12)

    def mlp(tp: ParallelContext) -> torch.Tensor:
        gate_up = ColumnParallelLinear(H, [N, N], False, tp, F64, CPU)
        gate_up.weight_loader(p(gate_up, "weight"), gate, 0)
        gate_up.weight_loader(p(gate_up, "weight"), up, 1)
        down_proj = RowParallelLinear(N, H, False, tp, F64, CPU)
        down_proj.load_whole(p(down_proj, "weight"), down)
        g, u = gate_up(X).chunk(2, dim=-1)
        return down_proj(F.silu(g) * u)

    want = (F.silu(X @ gate.T) * (X @ up.T)) @ down.T
    for got in on_ranks(size, mlp):
        assert torch.allclose(got, want)


@pytest.mark.parametrize("size", [1, 2, 3])
def test_vocab_parallel_embedding_and_head(size: int) -> None:
    """Every id is looked up by the one rank that holds it; the head's gathered logits are the
    whole vocabulary's (slices of 4/4/3 rows padded to 4 for the gather)."""
    table = randn(V, H, seed=13).float()
    ids = torch.tensor([0, 5, 6, 10, 3, 7])

    def embed_and_project(tp: ParallelContext) -> tuple[torch.Tensor, torch.Tensor]:
        embed = VocabParallelEmbedding(V, H, tp, torch.float32, CPU)
        embed.weight_loader(p(embed, "weight"), table)
        head = ParallelLMHead(V, H, tp, torch.float32, CPU)
        head.tie(embed)
        h = embed(ids)
        return h, head(h)

    for h, logits in on_ranks(size, embed_and_project):
        assert torch.equal(h, table[ids])
        assert logits.shape == (len(ids), V) and torch.allclose(logits, h @ table.T, atol=1e-5)


def test_shape_mismatch_and_shard_count() -> None:
    tp = rank_context(None, BASE)
    assert isinstance(tp, SingleRankContext) and tp.group.all_reduce(X) is X
    qkv = QKVParallelLinear(H, D, BASE.num_heads, BASE.num_kv_heads, False, tp, F64, CPU)
    assert qkv.num_shards == 3 and RowParallelLinear(N, H, False, tp, F64, CPU).num_shards == 1
    with pytest.raises(ValueError, match=r"has shape \(4, 16\), expected \(6, 16\)"):
        qkv.weight_loader(p(qkv, "weight"), WK[:4], 1)


def test_int8_is_a_method_swapped_into_any_parallel_linear() -> None:
    """The row-parallel layer keeps its collective; only the product changes, for small calls.
    (Shapes of 64 columns: torch's int8 kernel wants whole blocks of them.)"""
    tp = rank_context(None, BASE)
    w, b = randn(32, 64, seed=14).float() * 0.1, randn(32, seed=15).float()
    layer = RowParallelLinear(64, 32, True, tp, torch.float32, CPU)
    layer.load_whole(p(layer, "weight"), w)
    layer.load_whole(p(layer, "bias"), b)
    assert layer.method is DENSE and layer.q_weight is None
    layer.quantize_int8()
    assert isinstance(layer.method, Int8LinearMethod)
    q, scales = quantize_int8(w)
    x = randn(INT8_MAX_ROWS, 64, seed=16).float()
    want = x.to(torch.bfloat16).float() @ (q.float() * scales.float()[:, None]).T + b
    assert torch.allclose(layer(x), want, rtol=1e-2, atol=1e-2)
    tall = randn(INT8_MAX_ROWS + 1, 64, seed=17).float()  # too tall for int8: full precision
    assert torch.allclose(layer(tall), tall @ w.T + b, atol=1e-5)
