"""The MoE kernels: routing against HF's router, the grouped expert GEMM against a per-expert loop
in plain torch, and a token's result whatever other tokens share its experts."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
import transformers
from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeTopKRouter

from kernels.moe import ROW_TILE, Routing, expert_mlp, group_pairs, grouped_mm, route


def reference(x: torch.Tensor, experts: torch.Tensor, weights: torch.Tensor, gate_up: torch.Tensor,
              down: torch.Tensor) -> torch.Tensor:
    """One expert at a time over the tokens routed to it (HF's eager loop), accumulated in fp32."""
    out = torch.zeros(x.shape, dtype=torch.float32)
    for e in range(gate_up.shape[0]):
        token, slot = torch.where(experts == e)
        if len(token):
            gate, up = F.linear(x[token].float(), gate_up[e].float()).chunk(2, dim=-1)
            y = F.linear(F.silu(gate) * up, down[e].float())
            out.index_add_(0, token, y * weights[token, slot, None].float())
    return out


def weights_for(num_experts: int, inter: int, hidden: int, dtype: torch.dtype, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    gate_up = (torch.randn(num_experts, 2 * inter, hidden, generator=gen) / hidden**0.5).to(dtype)
    down = (torch.randn(num_experts, hidden, inter, generator=gen) / inter**0.5).to(dtype)
    return gate_up, down


def random_routing(tokens: int, num_experts: int, k: int, dtype: torch.dtype, seed: int = 1) -> Routing:
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(tokens, num_experts, generator=gen).to(dtype)
    return route(logits, k, normalize=True)


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
@pytest.mark.parametrize("tokens,k", [(1, 2), (3, 2), (37, 2), (37, 1), (37, 8)])
def test_expert_mlp_matches_per_expert_loop(dtype: torch.dtype, tol: float, tokens: int, k: int) -> None:
    E, inter, hidden = 8, 48, 64
    gate_up, down = weights_for(E, inter, hidden, dtype)
    x = torch.randn(tokens, hidden, generator=torch.Generator().manual_seed(2)).to(dtype)
    routing = random_routing(tokens, E, k, dtype)
    got = expert_mlp(x, routing, gate_up, down)
    want = reference(x, routing.experts, routing.weights, gate_up, down)
    assert got.dtype == dtype and got.shape == x.shape and got.is_contiguous()
    assert ((got.float() - want).norm() / want.norm()).item() <= tol


def test_groups_are_padded_tiles_in_expert_order() -> None:
    experts = torch.tensor([[0, 3], [3, 5], [0, 5], [1, 3]])
    groups = group_pairs(experts, 6)
    counts = torch.bincount(experts.reshape(-1), minlength=6)
    padded = (counts + ROW_TILE - 1) // ROW_TILE * ROW_TILE
    assert groups.ends.tolist() == padded.cumsum(0).tolist() and groups.rows == int(padded.sum())
    starts = groups.ends.long() - padded
    flat = experts.reshape(-1)
    for pair, row in zip(groups.order.tolist(), groups.dest.tolist(), strict=True):
        e = int(flat[pair])
        assert starts[e] <= row < starts[e] + counts[e]
    assert groups.source.tolist() == (groups.order // 2).tolist()
    assert len(set(groups.dest.tolist())) == flat.numel()


def test_grouped_mm_skips_empty_groups() -> None:
    w = torch.randn(3, 5, 4)
    x = torch.randn(8, 4)
    ends = torch.tensor([4, 4, 8], dtype=torch.int32)
    got = grouped_mm(x, w, ends)
    assert torch.allclose(got[:4], x[:4] @ w[0].T, atol=1e-6) and torch.allclose(got[4:], x[4:] @ w[2].T, atol=1e-6)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_tokens_result_does_not_depend_on_its_batch(dtype: torch.dtype) -> None:
    """Bit for bit: token 0 alone, and among batches that put 0 to 60 other tokens on its experts."""
    E, inter, hidden, k = 8, 256, 512, 2
    gate_up, down = weights_for(E, inter, hidden, dtype)
    x = torch.randn(64, hidden, generator=torch.Generator().manual_seed(3)).to(dtype)
    routing = random_routing(64, E, k, dtype)
    alone = expert_mlp(x[:1], Routing(routing.experts[:1], routing.weights[:1]), gate_up, down)[0]
    for n in (2, 3, 4, 5, 9, 17, 64):
        batch = expert_mlp(x[:n], Routing(routing.experts[:n], routing.weights[:n]), gate_up, down)
        assert torch.equal(batch[0], alone), n
    # Every token on token 0's experts: its groups are as full as they get.
    crowd = Routing(routing.experts[:1].expand(40, k).contiguous(), routing.weights[:1].expand(40, k).contiguous())
    assert torch.equal(expert_mlp(x[:1].expand(40, hidden).contiguous(), crowd, gate_up, down)[17], alone)


@pytest.mark.parametrize("normalize", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_route_matches_hf_router(normalize: bool, dtype: torch.dtype) -> None:
    E, hidden, k = 16, 32, 4
    config = transformers.Qwen3MoeConfig(hidden_size=hidden, num_experts=E, num_experts_per_tok=k,
                                         norm_topk_prob=normalize)
    router = Qwen3MoeTopKRouter(config).to(dtype)
    torch.nn.init.normal_(router.weight, std=0.5, generator=torch.Generator().manual_seed(4))
    h = torch.randn(50, hidden, generator=torch.Generator().manual_seed(5)).to(dtype)
    h[7] = 0  # every logit equal: the tie-break decides all k experts
    with torch.no_grad():
        _, hf_weights, hf_experts = router(h)
        ours = route(F.linear(h, router.weight), k, normalize)
    hf_order = torch.argsort(hf_experts, dim=-1)
    assert torch.equal(ours.experts, hf_experts.gather(1, hf_order))
    assert torch.equal(ours.weights, hf_weights.gather(1, hf_order)) and ours.weights.dtype == dtype
