"""The paged decode attention kernel (kernels/csrc/decode_attention.cpp): each request's one query
row per head against its KV slots, output and log-sum-exp against float64 softmax attention
(tests/kernels/csrc/attention_reference.py), within fp32's worst-case bound.

Lengths around the kernel's 8-key vectors and blocks (1, 7, 8, 9, 31, 33, 100, 129) share every
call; each query-heads-per-KV-head group 1..8 runs twice, in complementary (head_dim, dtype, slot
layout) choices, so every pair of those choices is met too.
"""

from __future__ import annotations

from types import ModuleType

import pytest
import torch

from tests.kernels.csrc.attention_reference import attend, indptr, paged_slots, scattered_slots, spans
from tests.kernels.csrc.rounding import assert_within

LENGTHS = [1, 7, 8, 9, 31, 33, 100, 129]
PAGE = 16
# (group, kv_heads, head_dim, dtype, paged): the 8 (head_dim, dtype, paged) combinations, each
# with two groups, and every group once with each dtype.
_COMBOS = [(hd, dt, pg) for hd in (64, 128) for dt in (torch.float32, torch.bfloat16) for pg in (False, True)]
CASES = [(g, 1 + g % 3, *_COMBOS[g - 1]) for g in range(1, 9)]
CASES += [(g, 1 + (g + 1) % 3, *_COMBOS[8 - g]) for g in range(1, 9)]


def _slots(paged: bool, gen: torch.Generator) -> tuple[list[torch.Tensor], int]:
    """Each request's slots and the pool's size: scattered single slots or scattered pages of 16."""
    if paged:
        pages = sum(-(-n // PAGE) for n in LENGTHS) + 7
        return paged_slots(LENGTHS, PAGE, pages, gen), pages * PAGE
    pool = sum(LENGTHS) + 40
    return scattered_slots(LENGTHS, pool, gen), pool


@pytest.mark.parametrize("group,kv_heads,head_dim,dtype,paged", CASES)
def test_decode_matches_float64(kernels: ModuleType, group: int, kv_heads: int, head_dim: int, dtype: torch.dtype,
                                paged: bool) -> None:
    gen = torch.Generator().manual_seed(group * 100 + head_dim + paged)
    rows, pool = _slots(paged, gen)
    k_pool, v_pool = (torch.randn(pool, kv_heads, head_dim, generator=gen).to(dtype) for _ in range(2))
    q = (2 * torch.randn(len(LENGTHS), kv_heads * group, head_dim, generator=gen)).to(dtype)  # peaked softmaxes too
    scale = head_dim**-0.5
    slots, starts = torch.cat(rows), indptr(LENGTHS)
    out, lse = kernels.decode_attention(q, k_pool, v_pool, slots, starts, scale)
    assert out.dtype == dtype and out.shape == q.shape and lse.dtype == torch.float32 and lse.shape == q.shape[:2]
    want = attend(q, k_pool[slots], v_pool[slots], scale, spans(starts[:-1].tolist(), LENGTHS, len(slots)))
    assert_within(out, want.out, want.out_bound, f"out [request, head, d] ({LENGTHS} keys)")
    assert_within(lse, want.lse, want.lse_bound, f"lse [request, head] ({LENGTHS} keys)")


def test_unsupported_shapes_are_refused(kernels: ModuleType) -> None:
    pool = torch.randn(10, 2, 64)
    slots, lengths = torch.arange(10), torch.tensor([0, 10])
    with pytest.raises(RuntimeError, match="head_dim 64 or 128"):
        small = torch.randn(10, 2, 32)
        kernels.decode_attention(torch.randn(1, 2, 32), small, small, slots, lengths, 0.1)
    with pytest.raises(RuntimeError, match="1 to 8 query heads per KV head, got 64 and 9"):
        one = torch.randn(10, 1, 64)
        kernels.decode_attention(torch.randn(1, 9, 64), one, one, slots, lengths, 0.1)
    with pytest.raises(RuntimeError, match="share a dtype"):
        kernels.decode_attention(torch.randn(1, 4, 64).bfloat16(), pool, pool, slots, lengths, 0.1)
    with pytest.raises(RuntimeError, match="int64 indices"):
        kernels.decode_attention(torch.randn(1, 4, 64), pool, pool, slots.int(), lengths, 0.1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_row_does_not_depend_on_the_rows_beside_it(kernels: ModuleType, dtype: torch.dtype) -> None:
    """Batch invariance: each row alone and in a batch of rows sharing its prefix are equal bit for bit."""
    gen = torch.Generator().manual_seed(8)
    heads, kv_heads, d = 9, 3, 64
    lengths = [600, 603, 1, 17, 598]
    pool = 700
    k_pool, v_pool = (torch.randn(pool, kv_heads, d, generator=gen).to(dtype) for _ in range(2))
    shared = torch.arange(1, 590)
    rows = [torch.cat([shared, torch.arange(600, 600 + n - 589)]) if n > 589 else torch.arange(1, n + 1)
            for n in lengths]
    q = torch.randn(len(lengths), heads, d, generator=gen).to(dtype)
    out, lse = kernels.decode_attention(q, k_pool, v_pool, torch.cat(rows), indptr(lengths), d**-0.5)
    for b, slots in enumerate(rows):
        alone, alone_lse = kernels.decode_attention(q[b : b + 1].contiguous(), k_pool, v_pool, slots,
                                                    indptr([len(slots)]), d**-0.5)
        assert torch.equal(alone[0], out[b]) and torch.equal(alone_lse[0], lse[b]), b
