"""One batch as the runner receives it (`ForwardEntry`s) and as it lays it out (`BatchPlan`).

`plan_batch` is pure Python: every length and slot a step needs is known on the host, so the
whole layout (indptrs, positions, KV write slots, request-table writes, the rows read from the
future map) is computed here and reaches the device in one upload (`kernels/transfer.py`). Only
the page list of each request's whole KV (`kv_indices`) is gathered on the device, from the
request table, because it grows with the context and is already there.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from runtime.contracts.sampling import SamplingParams

if TYPE_CHECKING:
    import torch


@dataclass
class ForwardEntry:
    """One request's part of a batch.

    Positions [kv_write_start, prefix_len + len(input_ids)) of row `row` get the slots
    `kv_write`; positions before kv_write_start must already be in the row. A fresh request
    with a cache hit writes its matched prefix too (kv_write_start=0); a decode step writes one.
    """

    row: int
    input_ids: list[int]  # with input_from_future: one placeholder, replaced on the device
    prefix_len: int
    kv_write: list[int]
    kv_write_start: int
    sampling: SamplingParams = field(default_factory=SamplingParams)
    output_ids: list[int] = field(default_factory=list)  # generated so far: penalties, seeds
    stop_ids: list[int] = field(default_factory=list)  # blocked while < min_new_tokens
    return_logprob: bool = False
    top_logprobs_num: int = 0
    # Input-token logprobs: row `logprob_start + i` of this entry scores `logprob_targets[i]`
    # (the token that follows it, which for a chunk's last row is the next chunk's first token).
    logprob_start: int = 0
    logprob_targets: list[int] | None = None
    # Overlap: the one input token is the one the previous forward sampled for this row, read
    # from the future map on the device (the scheduler has not seen it yet).
    input_from_future: bool = False
    # Constrained decoding: the int32 token bitmask row ([ceil(vocab/32)], xgrammar's layout)
    # that the token sampled for this entry must satisfy; None when unconstrained.
    token_bitmask: torch.Tensor | None = None
    # Speculative decoding: input_ids are [last token, *draft_ids]; every row gets logits and the
    # runner verifies the drafts (ForwardResult.accepted) instead of sampling the last row.
    draft_ids: list[int] | None = None
    # The new tokens were generated (a decode step, a speculative verify) rather than read from
    # the prompt: attention takes the decode path for them, the prefill path for prompt tokens
    # (kernels/torch_backend.py). None: one new token is a generated one (the scheduler always
    # says which).
    generated: bool | None = None
    # The prompt's last chunk of an embed request: the runner returns its last row's hidden state.
    embed: bool = False

    @property
    def is_generated(self) -> bool:
        return len(self.input_ids) == 1 if self.generated is None else self.generated

    @property
    def seq_len(self) -> int:
        return self.prefix_len + len(self.input_ids)


# The int64 arrays of a BatchPlan uploaded together, in this order.
UPLOADED = (
    "input_ids", "positions", "out_cache_loc", "rows", "last_rows", "num_pages", "kv_indptr",
    "future_at", "future_rows", "table_at", "table_slots",
)


@dataclass
class BatchPlan:
    """A batch's layout on the host. Requests are in entry order; T = sum of extend_lens."""

    page_size: int
    seq_lens: list[int]  # [B] tokens of KV per request after this step
    extend_lens: list[int]  # [B] new tokens per request
    generated: list[bool]  # [B] ForwardEntry.is_generated
    input_ids: list[int]  # [T] (placeholders where the future map supplies the token)
    positions: list[int]  # [T]
    out_cache_loc: list[int]  # [T] the KV slot each new token is written to
    rows: list[int]  # [B] request-table row of each request
    last_rows: list[int]  # [B] index in [T] of each request's last new token (its logits)
    num_pages: list[int]  # [B]
    kv_indptr: list[int]  # [B+1] cumulative pages
    kv_last_page_len: list[int]  # [B] tokens in each request's last page (1..page_size)
    qo_indptr: list[int]  # [B+1] cumulative new tokens
    future_at: list[int]  # indices in [T] whose token comes from the future map...
    future_rows: list[int]  # ...of these request rows
    table_at: list[int]  # flat indices (row * table_width + position) of the request table...
    table_slots: list[int]  # ...and the KV slots written there this step

    @property
    def batch_size(self) -> int:
        return len(self.seq_lens)

    @property
    def total_pages(self) -> int:
        return self.kv_indptr[-1]

    def arrays(self) -> list[list[int]]:
        return [getattr(self, name) for name in UPLOADED]


def cumsum(lengths: list[int]) -> list[int]:
    """[0, l0, l0 + l1, ...]."""
    out = [0]
    for n in lengths:
        out.append(out[-1] + n)
    return out


def plan_batch(entries: list[ForwardEntry], page_size: int, table_width: int) -> BatchPlan:
    """Lay out `entries` (checks each entry's KV writes cover its new tokens)."""
    assert entries, "empty batch"
    ps = page_size
    seq_lens = [e.seq_len for e in entries]
    extend_lens = [len(e.input_ids) for e in entries]
    num_pages = [(s + ps - 1) // ps for s in seq_lens]
    qo_indptr = cumsum(extend_lens)
    table_at: list[int] = []
    table_slots: list[int] = []
    out_cache_loc: list[int] = []
    positions: list[int] = []
    for e in entries:
        end = e.kv_write_start + len(e.kv_write)
        assert end == e.seq_len, (
            f"row {e.row}: kv_write covers [{e.kv_write_start}, {end}) but the sequence has {e.seq_len} tokens"
        )
        assert e.kv_write_start <= e.prefix_len, "the new tokens' slots must be written"
        base = e.row * table_width
        table_at.extend(range(base + e.kv_write_start, base + end))
        table_slots.extend(e.kv_write)
        out_cache_loc.extend(e.kv_write[e.prefix_len - e.kv_write_start :])
        positions.extend(range(e.prefix_len, e.seq_len))
    future = [i for i, e in enumerate(entries) if e.input_from_future]
    return BatchPlan(
        page_size=ps,
        seq_lens=seq_lens,
        extend_lens=extend_lens,
        generated=[e.is_generated for e in entries],
        input_ids=[t for e in entries for t in e.input_ids],
        positions=positions,
        out_cache_loc=out_cache_loc,
        rows=[e.row for e in entries],
        last_rows=[end - 1 for end in qo_indptr[1:]],
        num_pages=num_pages,
        kv_indptr=cumsum(num_pages),
        kv_last_page_len=[s - (n - 1) * ps for s, n in zip(seq_lens, num_pages)],
        qo_indptr=qo_indptr,
        future_at=[qo_indptr[i] for i in future],
        future_rows=[entries[i].row for i in future],
        table_at=table_at,
        table_slots=table_slots,
    )
