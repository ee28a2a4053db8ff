"""The cascade (kernels/csrc/cascade_attention.cpp): decode rows sharing a KV prefix, the prefix
attended once for all of them (in chunks of keys) and merged with each row's own slots by
log-sum-exp, against float64 softmax attention over each row's whole slot list
(tests/kernels/csrc/attention_reference.py).

The bound is the whole list's (with the prefix's 32-key blocks and bf16 weights for P.V), plus
the merge: each part's weight exp(lse_i - top) is off by its log-sum-exp's error and the exp's
(the common `top` cancels), the parts' weighted sum adds a rounding per part, and a bf16 row's
own part arrives rounded to bf16 before the merge.
"""

from __future__ import annotations

from types import ModuleType

import pytest
import torch

from tests.kernels.csrc.attention_reference import attend, indptr, scattered_slots, spans
from tests.kernels.csrc.rounding import FAST_ULPS, U32, UBF16, assert_within, gamma

# (rows, shared prefix, own tokens of the longest row, KV heads, query heads per KV head, head dim):
# one row; a prefix under one 128-key chunk and over several, not a multiple of the 32-key block;
# more rows than one tile's 48 query rows; every group 1..8.
CASES = [(1, 33, 1, 1, 1, 64), (16, 1024, 128, 3, 3, 64), (5, 300, 7, 2, 4, 128), (20, 129, 3, 3, 3, 64),
         (7, 517, 2, 1, 8, 64), (3, 64, 40, 2, 5, 128), (9, 200, 5, 2, 2, 128), (4, 131, 9, 1, 6, 64),
         (6, 95, 4, 2, 7, 128)]


def _reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, shared: int, own_lens: list[int],
               scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(float64 attention [B, H, D], its bound for the cascade): k, v the shared prefix's keys, then
    each row's own keys; row b sees the prefix and its own."""
    bf16 = q.dtype == torch.bfloat16
    total, rows = k.shape[0], len(own_lens)
    visible = spans([0] * rows, [shared] * rows, total) | spans((shared + indptr(own_lens)[:-1]).tolist(), own_lens,
                                                                total)
    whole = attend(q, k, v, scale, visible, key_block=32, p_unit=UBF16 if bf16 else 0.0, out_unit=0.0)
    parts = shared // 128 + 2  # the prefix's chunks (at most one per 128 keys) and the own part
    # A part's log-sum-exp over fewer keys is within the whole list's bound taken twice (its
    # spread and its terms are at most the whole list's); then the exp of lse_i - top.
    eta = 2 * whole.lse_bound + FAST_ULPS * U32
    bound = whole.out_bound + (2.1 * eta + gamma(2 * parts + 4) + (UBF16 if bf16 else 0.0))[..., None] * whole.v_max
    if bf16:
        bound = bound + UBF16 * (whole.out.abs() + bound)
    return whole.out, bound


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("batch,shared,own,kv_heads,group,head_dim", CASES)
def test_cascade_matches_whole_rows(kernels: ModuleType, dtype: torch.dtype, batch: int, shared: int, own: int,
                                    kv_heads: int, group: int, head_dim: int) -> None:
    gen = torch.Generator().manual_seed(batch * 1000 + shared)
    own_lens = [max(1, own - b % 3) for b in range(batch)]  # uneven, at least 1 (the newest token)
    pool_slots = 1 + shared + sum(own_lens) + 10
    k, v = (torch.randn(pool_slots, kv_heads, head_dim, generator=gen).to(dtype) for _ in range(2))
    prefix, *owns = scattered_slots([shared, *own_lens], pool_slots, gen)
    q = (2 * torch.randn(batch, kv_heads * group, head_dim, generator=gen)).to(dtype)
    scale = head_dim**-0.5
    out = kernels.cascade_attention(q, k, v, prefix, torch.cat(owns), indptr(own_lens), scale)
    assert out.dtype == dtype and out.shape == q.shape
    keys = torch.cat([prefix, *owns])
    want, bound = _reference(q, k[keys], v[keys], shared, own_lens, scale)
    assert_within(out, want, bound, f"out [row, head, d] ({shared} shared, {own_lens} own)")


def test_an_empty_shared_prefix_is_refused(kernels: ModuleType) -> None:
    """Without a shared prefix the rows are plain decode rows (decode_attention); the cascade
    refuses an empty one rather than merging an empty part."""
    k = v = torch.randn(8, 1, 64)
    q = torch.randn(2, 2, 64)
    with pytest.raises(RuntimeError, match="at least one"):
        kernels.cascade_attention(q, k, v, torch.zeros(0, dtype=torch.int64), torch.tensor([1, 2]),
                                  torch.tensor([0, 1, 2]), 0.125)
