"""The speculative verify step: a speculative entry's rows carry [last token, *drafts]; every
row gets logits, and the drafts are accepted while they match what the model would pick
(kernels/spec_verify.py). Such entries never need penalties, grammars or logprobs."""

from __future__ import annotations

import torch

from kernels.spec_verify import accept_greedy, verify_drafts
from kernels.transfer import upload
from runtime.execution.forward_batch import BatchPlan, ForwardEntry
from runtime.execution.forward_result import ForwardResult
from runtime.models.base import CausalLM


def apply_draft_verification(model: CausalLM, entries: list[ForwardEntry], plan: BatchPlan, hidden: torch.Tensor,
                             result: ForwardResult) -> None:
    """Replace the sampled token of each speculative entry by its verification's outcome and
    record the drafts each accepted (`result.accepted`)."""
    device = hidden.device
    accepted: list[list[int]] = [[] for _ in entries]
    next_ids = result.host_next_ids()
    spec = [i for i, e in enumerate(entries) if e.draft_ids]
    # Every speculative row's logits in one lm_head call, then split by entry.
    rows = [r for i in spec for r in range(plan.qo_indptr[i], plan.qo_indptr[i + 1])]
    logits = model.compute_logits(hidden.index_select(0, upload(rows, torch.int64, device)))
    greedy_best = logits.argmax(dim=-1).tolist() if any(entries[i].sampling.is_greedy for i in spec) else []
    start = 0
    for i in spec:
        e = entries[i]
        drafts = e.draft_ids or []
        end = start + len(drafts) + 1
        if e.sampling.is_greedy:  # the argmax prefix, read from the one host copy above
            count, next_ids[i] = accept_greedy(greedy_best[start:end], drafts)
        else:
            count, next_ids[i] = verify_drafts(logits[start:end], drafts, e.sampling)
        accepted[i] = drafts[:count]
        start = end
    result.next_ids = upload(next_ids, torch.int64, device)
    result.start_host_copy()
    result.accepted = accepted
