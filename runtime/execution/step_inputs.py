"""A step's device inputs: the host plan (`forward_batch.plan_batch`) uploaded in one copy, the
request table rows written, and every request's page list gathered on the device.

Nothing here waits for the device: every size comes from the host plan.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import chain

import torch

from kernels.base import ForwardMetadata
from kernels.kv_pool import ReqToTokenPool
from kernels.transfer import host_tensor, upload
from runtime.execution.forward_batch import UPLOADED, BatchPlan, ForwardEntry, plan_batch


@dataclass
class StepInputs:
    """One step's device inputs, from one upload of its BatchPlan."""

    plan: BatchPlan
    meta: ForwardMetadata
    input_ids: torch.Tensor  # int64 [T], future-map tokens filled in
    last_rows: torch.Tensor  # int64 [B]
    rows: torch.Tensor  # int64 [B]


def prepare_step(entries: list[ForwardEntry], page_size: int, req_to_token: ReqToTokenPool,
                 future_tokens: torch.Tensor, device: torch.device, page_list: torch.Tensor | None = None
                 ) -> StepInputs:
    """Plan the batch on the host, upload it in one copy, write the entries' slots into their
    rows of the request table, read overlap inputs from the future map, and gather every
    request's page list (into the front of `page_list` when given)."""
    plan = plan_batch(entries, page_size, req_to_token.max_context_len)
    arrays = plan.arrays()
    flat = upload(list(chain.from_iterable(arrays)), torch.int64, device)
    dev = dict(zip(UPLOADED, flat.split([len(a) for a in arrays]), strict=True))
    table = req_to_token.table
    if plan.table_at:
        table.view(-1).index_copy_(0, dev["table_at"], dev["table_slots"].to(table.dtype))
    input_ids = dev["input_ids"]
    if plan.future_at:
        input_ids.index_copy_(0, dev["future_at"], future_tokens.index_select(0, dev["future_rows"]))
    int32 = torch.int32
    meta = ForwardMetadata(
        kv_indices=gather_kv_indices(table, dev["rows"], dev["num_pages"], dev["kv_indptr"], plan, page_list),
        positions=dev["positions"],
        out_cache_loc=dev["out_cache_loc"],
        page_size=plan.page_size,
        seq_lens=plan.seq_lens,
        extend_lens=plan.extend_lens,
        qo_indptr_host=host_tensor(plan.qo_indptr, int32, device),
        kv_indptr_host=host_tensor(plan.kv_indptr, int32, device),
        kv_last_page_len_host=host_tensor(plan.kv_last_page_len, int32, device),
        generated=plan.generated,
    )
    return StepInputs(plan, meta, input_ids, dev["last_rows"], dev["rows"])


def gather_kv_indices(
    table: torch.Tensor, rows: torch.Tensor, num_pages: torch.Tensor, kv_indptr: torch.Tensor, plan: BatchPlan,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Every request's page ids, request after request (int32 [total pages]), read on the device
    from the request table: page p of request i is table[rows[i], p * page_size] // page_size.
    With `out`, written into its front (the same one conversion kernel) and returned as that view.

    Sizes come from the host plan (`output_size`), so nothing waits for the device, unlike a
    boolean-mask gather whose result size only the device knows.
    """
    total, ps = plan.total_pages, plan.page_size
    owner = torch.repeat_interleave(num_pages, output_size=total)
    page = torch.arange(total, device=table.device) - kv_indptr.index_select(0, owner)
    slots = table[rows.index_select(0, owner), page * ps]
    pages = slots // ps if ps > 1 else slots
    if out is None:
        return pages.to(torch.int32)
    return out[:total].copy_(pages)
