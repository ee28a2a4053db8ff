"""Softmax attention in float64 with the bounds the kernels' fp32 results must keep to it, and the
KV slot layouts the attention tests use.

The bound for one output row (a query position and head) follows from the kernels' arithmetic:
  - each score s_l = scale * q . k_l is within eta_s = gamma(D + 2) * scale * sum |q_i k_li| of
    exact (D products and sums, the scale, and the dtype's values exact in fp32);
  - each weight exp(s_l - top) is then within eta = eta_s + U32 |s_l - top| + FAST_ULPS U32 of its
    exact value relatively (the subtraction and the vector exp; a shift shared by every key, as
    an inexact `top`, cancels between the output's numerator and denominator);
  - weights off by relative eta move sum_l w_l v_l / sum_l w_l by at most 2 eta max_l |v_l|
    (the error is sum w_l eta_l (v_l - o) / sum w_l and |v_l - o| <= 2 max |v|);
  - the two sums over L keys, the rescales of an online softmax (one per key block, on both
    sums) and the normalisation (a reciprocal and a product) add gamma(2 L + 2 blocks + 4) +
    FAST_ULPS U32 of max |v|;
  - a kernel that rounds the weights to bf16 before P.V (prefill's vdpbf16ps path) adds UBF16
    of max |v| (the numerator's weights alone, so it does not cancel);
  - an output in bf16 adds one rounding of the result.
max |v| is taken over all the call's keys (at least each row's). The log-sum-exp's bound: eta
for the keys' weights, gamma(L + 1) for the sum, and the log's and the final add's roundings.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import NamedTuple

import torch

from tests.kernels.csrc.rounding import FAST_ULPS, U32, UBF16, gamma


class Attention(NamedTuple):
    """Float64 results [n, H, D] and [n, H] with the bounds the kernel must keep to them."""

    out: torch.Tensor
    lse: torch.Tensor
    out_bound: torch.Tensor
    lse_bound: torch.Tensor
    v_max: torch.Tensor  # [1, H, D]: max |v| over the call's keys


@contextmanager
def one_thread() -> Iterator[None]:
    """torch on one thread: a float64 reference on tensors this small gains nothing from a second,
    and on a loaded machine each threaded op waited for one (ten times the tests' time)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, visible: torch.Tensor,
           key_block: int = 1, p_unit: float = 0.0, out_unit: float | None = None) -> Attention:
    """q [n, H, D] against k, v [L, KVH, D] (query head h reads KV head h // (H / KVH)); query row
    j sees the keys where visible[j] (bool [n, L]; at least one). `key_block`: the keys per block
    of an online softmax (one rescale each); `p_unit`: the unit of a rounding of the weights
    before P.V (0: none); `out_unit`: of the output's (default: UBF16 for a bf16 q, else 0)."""
    with one_thread():
        return _attend(q, k, v, scale, visible, key_block, p_unit, out_unit)


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, visible: torch.Tensor, key_block: int,
            p_unit: float, out_unit: float | None) -> Attention:
    n, heads, dim = q.shape
    kv_heads = k.shape[1]
    qf = q.double().view(n, kv_heads, heads // kv_heads, dim)
    kf, vf = k.double(), v.double()
    hidden = ~visible[:, None, None, :]  # [n, 1, 1, L]
    scores = (torch.einsum("nkgd,lkd->nkgl", qf, kf) * scale).masked_fill(hidden, float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)
    out = torch.einsum("nkgl,lkd->nkgd", torch.softmax(scores, dim=-1), vf).reshape(n, heads, dim)

    magnitude = torch.einsum("nkgd,lkd->nkgl", qf.abs(), kf.abs()) * scale
    eta_s = gamma(dim + 2) * magnitude.masked_fill(hidden, 0).amax(dim=-1)
    spread = (scores.amax(dim=-1, keepdim=True) - scores).masked_fill(hidden, 0).amax(dim=-1)
    eta = (eta_s + U32 * spread + FAST_ULPS * U32).reshape(n, heads)
    keys = visible.sum(dim=1, keepdim=True).double()  # [n, 1]
    v_max = vf.abs().amax(dim=0).repeat_interleave(heads // kv_heads, dim=0)[None]
    sums = gamma(2 * keys + 2 * torch.ceil(keys / key_block) + 4) + FAST_ULPS * U32  # + the reciprocal
    out_bound = (2.1 * eta + sums + p_unit)[..., None] * v_max
    if out_unit is None:
        out_unit = UBF16 if q.dtype == torch.bfloat16 else 0.0
    out_bound = out_bound + out_unit * (out.abs() + out_bound)
    lse = lse.reshape(n, heads)
    lse_bound = 1.1 * eta + gamma(keys + 1) + (FAST_ULPS + 1) * U32 * (lse.abs() + torch.log(keys) + 1)
    return Attention(out, lse, out_bound, lse_bound, v_max)


def spans(starts: list[int], counts: list[int], total: int) -> torch.Tensor:
    """bool [len(starts), total]: row i sees keys starts[i] .. starts[i] + counts[i] - 1."""
    keys = torch.arange(total)[None, :]
    first = torch.tensor(starts)[:, None]
    return (keys >= first) & (keys < first + torch.tensor(counts)[:, None])


def scattered_slots(lengths: list[int], pool_slots: int, gen: torch.Generator) -> list[torch.Tensor]:
    """Each request's KV slots, distinct and in random order over the pool (slot 0 unused: padding)."""
    order = torch.randperm(pool_slots - 1, generator=gen)[: sum(lengths)] + 1
    return list(order.split(lengths))


def paged_slots(lengths: list[int], page_size: int, pool_pages: int, gen: torch.Generator) -> list[torch.Tensor]:
    """Each request's KV slots in whole pages of `page_size` slots, its pages scattered over the
    pool (page 0 unused) and its last page partial where its length is not a multiple."""
    counts = [-(-n // page_size) for n in lengths]
    pages = (torch.randperm(pool_pages - 1, generator=gen)[: sum(counts)] + 1).split(counts)
    offsets = torch.arange(page_size)
    return [(p[:, None] * page_size + offsets[None, :]).reshape(-1)[:n] for p, n in zip(pages, lengths)]


def indptr(lengths: list[int]) -> torch.Tensor:
    """[0, n_0, n_0 + n_1, ...] as int64."""
    return torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int64)
