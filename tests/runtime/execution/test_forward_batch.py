"""The host-side layout of a batch (pure Python)."""

from __future__ import annotations

import pytest

from runtime.execution.forward_batch import UPLOADED, ForwardEntry, cumsum, plan_batch

WIDTH = 100  # request-table width


def test_mixed_batch_with_a_cached_prefix_and_pages() -> None:
    prefill = ForwardEntry(row=3, input_ids=[5, 6, 7], prefix_len=4, kv_write=[10, 11, 12, 13, 20, 21, 22],
                           kv_write_start=0)  # cache hit of 4 tokens: its slots are written too
    decode = ForwardEntry(row=1, input_ids=[0], prefix_len=5, kv_write=[30], kv_write_start=5,
                          input_from_future=True)
    plan = plan_batch([prefill, decode], page_size=4, table_width=WIDTH)
    assert plan.seq_lens == [7, 6] and plan.extend_lens == [3, 1]
    assert plan.qo_indptr == [0, 3, 4] and plan.last_rows == [2, 3]
    assert plan.num_pages == [2, 2] and plan.kv_indptr == [0, 2, 4] and plan.total_pages == 4
    assert plan.kv_last_page_len == [3, 2]
    assert plan.positions == [4, 5, 6, 5]
    assert plan.out_cache_loc == [20, 21, 22, 30]
    assert plan.table_at == [300 + p for p in range(7)] + [105]
    assert plan.table_slots == [10, 11, 12, 13, 20, 21, 22, 30]
    assert plan.future_at == [3] and plan.future_rows == [1]
    assert plan.input_ids == [5, 6, 7, 0]
    assert [len(a) for a in plan.arrays()] == [len(getattr(plan, n)) for n in UPLOADED]


def test_kv_writes_must_cover_the_new_tokens() -> None:
    short = ForwardEntry(row=0, input_ids=[1, 2], prefix_len=0, kv_write=[5], kv_write_start=0)
    with pytest.raises(AssertionError, match="kv_write covers"):
        plan_batch([short], page_size=1, table_width=WIDTH)
    late = ForwardEntry(row=0, input_ids=[1], prefix_len=2, kv_write=[9], kv_write_start=3)
    with pytest.raises(AssertionError):
        plan_batch([late], page_size=1, table_width=WIDTH)


def test_cumsum() -> None:
    assert cumsum([]) == [0]
    assert cumsum([2, 0, 3]) == [0, 2, 2, 5]
