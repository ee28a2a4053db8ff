"""The paged causal prefill kernel (kernels/csrc/prefill_attention.cpp) against float64 causal
softmax attention (tests/kernels/csrc/attention_reference.py), within fp32's worst-case bound
(and, for bf16 pools, the weights' rounding to bf16 where the CPU multiplies in bf16 pairs).

Every call holds requests with no cached prefix and with one, and tails around the kernel's
tiles (48 query rows: 48 // group positions) and its 32-key blocks; each group 1..8 runs twice in
complementary (head_dim, dtype, slot layout) choices.
"""

from __future__ import annotations

from types import ModuleType

import pytest
import torch

from tests.kernels.csrc.attention_reference import attend, indptr, paged_slots, scattered_slots, spans
from tests.kernels.csrc.rounding import UBF16, assert_within

# (new query rows, cached prefix) per request: one row, odd sizes, a prefix of 0, a tile's
# positions for several groups plus or minus one (6, 8, 9, 12, 16, 24, 48), keys around 32 and
# 64, and a longer prefix over many key blocks.
REQUESTS = [(1, 0), (7, 0), (1, 13), (17, 40), (33, 0), (5, 31), (9, 23), (49, 15), (13, 300)]
PAGE = 16
_COMBOS = [(hd, dt, pg) for hd in (64, 128) for dt in (torch.float32, torch.bfloat16) for pg in (False, True)]
CASES = [(g, 1 + g % 3, *_COMBOS[g - 1]) for g in range(1, 9)]
CASES += [(g, 1 + (g + 1) % 3, *_COMBOS[8 - g]) for g in range(1, 9)]


def _slots(lengths: list[int], paged: bool, gen: torch.Generator) -> tuple[list[torch.Tensor], int]:
    if paged:
        pages = sum(-(-n // PAGE) for n in lengths) + 5
        return paged_slots(lengths, PAGE, pages, gen), pages * PAGE
    pool = sum(lengths) + 30
    return scattered_slots(lengths, pool, gen), pool


def _check(got: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, requests: list[tuple[int, int]],
           what: str) -> None:
    """got and q [rows, H, D], each request's rows after the last's; k, v [keys, KVH, D], each
    request's prefix + n keys after the last's: a request's row j sees its keys 0 .. prefix + j."""
    starts, counts, first = [], [], 0
    for n, prefix in requests:
        starts += [first] * n
        counts += [prefix + j + 1 for j in range(n)]
        first += prefix + n
    p_unit = UBF16 if q.dtype == torch.bfloat16 else 0.0  # P rounded to bf16 for vdpbf16ps
    want = attend(q, k, v, q.shape[2] ** -0.5, spans(starts, counts, first), key_block=32, p_unit=p_unit)
    assert_within(got, want.out, want.out_bound, what)


@pytest.mark.parametrize("group,kv_heads,head_dim,dtype,paged", CASES)
def test_prefill_matches_float64(kernels: ModuleType, group: int, kv_heads: int, head_dim: int,
                                 dtype: torch.dtype, paged: bool) -> None:
    gen = torch.Generator().manual_seed(group * 100 + head_dim + paged)
    lengths = [n + p for n, p in REQUESTS]
    rows, pool = _slots(lengths, paged, gen)
    k_pool, v_pool = (torch.randn(pool, kv_heads, head_dim, generator=gen).to(dtype) for _ in range(2))
    q_indptr = indptr([n for n, _ in REQUESTS])
    q = (2 * torch.randn(int(q_indptr[-1]), kv_heads * group, head_dim, generator=gen)).to(dtype)
    out = torch.full_like(q, 7.0)
    kernels.prefill_attention(q, k_pool, v_pool, torch.cat(rows), q_indptr, indptr(lengths), head_dim**-0.5, out)
    slots = torch.cat(rows)
    _check(out, q, k_pool[slots], v_pool[slots], REQUESTS, f"out [row, head, d] of requests {REQUESTS}")

def test_requests_without_kv_are_skipped_and_bad_shapes_refused(kernels: ModuleType) -> None:
    gen = torch.Generator().manual_seed(4)
    q, pool = torch.randn(6, 6, 64, generator=gen), torch.randn(20, 2, 64, generator=gen)
    slots = torch.arange(20, dtype=torch.int64)
    q_indptr, kv_indptr = torch.tensor([0, 2, 6]), torch.tensor([0, 0, 10])  # request 0: no KV, skipped
    out = torch.full_like(q, 7.0)
    kernels.prefill_attention(q, pool, pool, slots, q_indptr, kv_indptr, 64**-0.5, out)
    assert (out[:2] == 7.0).all()
    _check(out[2:], q[2:], pool[:10], pool[:10], [(4, 6)], "the request after one without KV")
    with pytest.raises(RuntimeError, match="has 4 query rows and 3 KV slots"):
        kernels.prefill_attention(q, pool, pool, slots, q_indptr, torch.tensor([0, 0, 3]), 0.125, out)
    with pytest.raises(RuntimeError, match="head_dim 64 or 128"):
        small = torch.randn(6, 6, 16)
        kernels.prefill_attention(small, pool[..., :16].contiguous(), pool[..., :16].contiguous(), slots, q_indptr,
                                  kv_indptr, 0.25, torch.empty_like(small))
    with pytest.raises(RuntimeError, match="1 to 8 query heads per KV head"):
        wide = torch.randn(6, 18, 64)
        kernels.prefill_attention(wide, pool, pool, slots, q_indptr, kv_indptr, 0.125, torch.empty_like(wide))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_row_does_not_depend_on_how_its_prompt_is_chunked(kernels: ModuleType, dtype: torch.dtype) -> None:
    """Batch invariance (runtime/execution/engines.py): a prompt's rows computed in one call, in
    chunks over the cached part before them, or beside another request, are equal bit for bit."""
    gen = torch.Generator().manual_seed(9)
    heads, kv_heads, d, n = 9, 3, 64, 101
    k_pool, v_pool = (torch.randn(n + 40, kv_heads, d, generator=gen).to(dtype) for _ in range(2))
    q = torch.randn(n, heads, d, generator=gen).to(dtype)
    slots = torch.arange(1, n + 1)
    whole = torch.empty_like(q)
    kernels.prefill_attention(q, k_pool, v_pool, slots, indptr([n]), indptr([n]), d**-0.5, whole)
    for start in (1, 5, 32, 47, 48, 64, 100):  # chunk starts around the 32-key blocks and 48-row tiles
        chunk = torch.empty_like(q[start:])
        kernels.prefill_attention(q[start:].contiguous(), k_pool, v_pool, slots, indptr([n - start]), indptr([n]),
                                  d**-0.5, chunk)
        assert torch.equal(chunk, whole[start:]), start
    other = torch.randn(7, heads, d, generator=gen).to(dtype)  # a second request first in the call
    both = torch.empty(7 + n, heads, d, dtype=dtype)
    kernels.prefill_attention(torch.cat([other, q]), k_pool, v_pool, torch.cat([torch.arange(n + 1, n + 8), slots]),
                              indptr([7, n]), indptr([7, n]), d**-0.5, both)
    assert torch.equal(both[7:], whole)
