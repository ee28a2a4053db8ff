"""Mixture-of-experts MLP kernels: top-k routing, and every expert's SwiGLU MLP as two grouped GEMMs
over the experts' stacked weights (not a Python loop over experts).

Layout of one call with T tokens, top-k experts each (P = T * k (token, expert) pairs):

    pairs sorted by expert id (stable: tokens ascending within an expert)
    rows  [ e0: its pairs | zero pad ][ e1: ... | pad ] ...   each group a multiple of ROW_TILE rows
    ends  cumulative group ends: the `offs` of torch._grouped_mm
    gate_up = grouped_mm(rows, W_gate_up[e].T) -> SiLU(gate) * up -> grouped_mm(., W_down[e].T)
    each pair's row, times its routing weight, summed per token in ascending expert order

Batch invariance: a token's result must not depend on which other tokens share its experts (the
scheduler's equivalence grid). The CPU GEMM under torch._grouped_mm takes a different path for a
group of 1-3 rows than for 4 or more (a GEMV-like one, whose sums round differently), and from 4
rows on gives each row the same bits whatever the group's size and the row's place in it (checked
here for fp32 and bf16 at the shapes of real MoE models, and by tests/kernels/test_moe.py): so
every group is padded with zero rows to a multiple of ROW_TILE. The per-token sum then runs in a
fixed order (ascending expert id, HF's order), never over a reduction whose order could vary.
The padding costs decode steps in fp32, where most groups hold one row and its GEMV path is the
faster one; with --enable-batch-variance the engines choice (runtime/execution/engines.py) passes
`row_tile=1`, unpadded.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F

# Rows per expert group are padded to a multiple of this (see the module docstring).
ROW_TILE = 4


class Routing(NamedTuple):
    """Each token's top-k experts, in ascending expert id, and their weights (model dtype)."""

    experts: torch.Tensor  # int64 [T, k]
    weights: torch.Tensor  # [T, k], the router logits' dtype


def route(logits: torch.Tensor, top_k: int, normalize: bool) -> Routing:
    """HF Qwen3-MoE's router on `logits` [T, E] (model dtype): softmax in fp32, torch.topk (its
    tie-breaking), renormalized in fp32 when `normalize`, cast back to the logits' dtype. The
    slots are then sorted by expert id, the order HF's expert loop adds them in."""
    probs = torch.softmax(logits, dim=-1, dtype=torch.float32)
    weights, experts = torch.topk(probs, top_k, dim=-1)
    if normalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    experts, order = torch.sort(experts, dim=-1)
    return Routing(experts, weights.gather(1, order).to(logits.dtype))


class Groups(NamedTuple):
    """Where each (token, expert) pair sits in the padded, expert-grouped rows."""

    source: torch.Tensor  # int64 [P]: the token of each pair, in expert order
    dest: torch.Tensor  # int64 [P]: its row in the grouped rows
    order: torch.Tensor  # int64 [P]: its index in the flat [T * k] pairs
    ends: torch.Tensor  # int32 [E]: cumulative padded group ends (grouped_mm's offs)
    rows: int  # total padded rows


def group_pairs(experts: torch.Tensor, num_experts: int, row_tile: int = ROW_TILE) -> Groups:
    """Sort the pairs of `experts` [T, k] by expert and place them in groups padded to `row_tile`."""
    k = experts.shape[1]
    flat = experts.reshape(-1)
    order = torch.argsort(flat, stable=True)
    by_expert = flat[order]
    counts = torch.bincount(flat, minlength=num_experts)
    padded = (counts + row_tile - 1) // row_tile * row_tile
    ends = padded.cumsum(0)
    first_pair = counts.cumsum(0) - counts  # index in `order` of each expert's first pair
    rank = torch.arange(flat.numel(), device=flat.device) - first_pair[by_expert]
    dest = ends[by_expert] - padded[by_expert] + rank
    rows = int(ends[-1]) if num_experts else 0
    return Groups(order // k, dest, order, ends.to(torch.int32), rows)


def grouped_mm(x: torch.Tensor, weight: torch.Tensor, ends: torch.Tensor) -> torch.Tensor:
    """x [M, K] in groups ending at `ends` (int32 [E]) -> [M, N]: group e's rows times weight[e].T,
    with `weight` [E, N, K] (HF's row-major linear weights, stacked)."""
    if _GROUPED_MM_WORKS.get((x.device.type, x.dtype), True):
        try:
            out: torch.Tensor = torch._grouped_mm(x, weight.transpose(1, 2), offs=ends)
            return out
        except (RuntimeError, NotImplementedError):  # a device or dtype without the kernel
            _GROUPED_MM_WORKS[(x.device.type, x.dtype)] = False
    return _grouped_mm_loop(x, weight, ends)


_GROUPED_MM_WORKS: dict[tuple[str, torch.dtype], bool] = {}


def _grouped_mm_loop(x: torch.Tensor, weight: torch.Tensor, ends: torch.Tensor) -> torch.Tensor:
    """The same product, group by group (where torch._grouped_mm has no kernel)."""
    out = x.new_empty(x.shape[0], weight.shape[1])
    start = 0
    for e, end in enumerate(ends.tolist()):
        if end > start:
            out[start:end] = F.linear(x[start:end], weight[e])
        start = end
    return out


def expert_mlp(x: torch.Tensor, routing: Routing, gate_up: torch.Tensor, down: torch.Tensor,
               row_tile: int = ROW_TILE) -> torch.Tensor:
    """sum_j weight[t, j] * down[e_j] @ (SiLU(gate[e_j] @ x_t) * up[e_j] @ x_t) for each token t.

    x [T, H]; gate_up [E, 2I, H] (gate rows, then up rows); down [E, H, I] -> [T, H] in x's dtype.
    `row_tile`: groups padded to a multiple of it (ROW_TILE: a token's result is its own).
    """
    T, k = routing.experts.shape
    groups = group_pairs(routing.experts, gate_up.shape[0], row_tile)
    rows = x.new_zeros(groups.rows, x.shape[1])
    rows[groups.dest] = x[groups.source]
    gate, up = grouped_mm(rows, gate_up, groups.ends).chunk(2, dim=-1)
    out_rows = grouped_mm(F.silu(gate) * up, down, groups.ends)
    pairs = x.new_empty(T * k, x.shape[1])
    pairs[groups.order] = out_rows[groups.dest]
    weighted = pairs.view(T, k, -1) * routing.weights.unsqueeze(-1)
    out = weighted[:, 0].contiguous()  # a copy only when k == 1 (the loop below makes new tensors)
    for j in range(1, k):  # a fixed order per token: ascending expert id, as HF adds them
        out = out + weighted[:, j]
    return out
