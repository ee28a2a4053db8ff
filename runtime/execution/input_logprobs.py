"""Log-probs of given input tokens (prompt scoring, `select`, `logprob_start_len`), computed only
for the entries that ask. They read their results back at once: scoring requests are not the
decode fast path."""

from __future__ import annotations

import torch

from kernels.transfer import upload
from runtime.execution.forward_batch import BatchPlan, ForwardEntry
from runtime.execution.forward_result import TopLogprobs
from runtime.models.base import CausalLM

INPUT_LOGPROB_ROWS = 256  # prompt rows scored per lm_head call


def input_logprobs(
    model: CausalLM, entries: list[ForwardEntry], plan: BatchPlan, hidden: torch.Tensor | None
) -> tuple[list[list[float] | None], list[TopLogprobs | None]]:
    """Per entry: the log-prob of each of its `logprob_targets` (and the top ones), or None."""
    lps: list[list[float] | None] = [None] * len(entries)
    tops: list[TopLogprobs | None] = [None] * len(entries)
    for i, e in enumerate(entries):
        if not e.logprob_targets:
            continue
        assert hidden is not None, "graph steps never score input tokens"
        first = plan.qo_indptr[i] + e.logprob_start
        row_lps: list[float] = []
        row_tops: TopLogprobs = []
        # In slices: a whole chunk's rows at once would be [chunk, vocab] fp32 (1.2 GB for
        # 2048 rows of a 150k vocabulary).
        for start in range(0, len(e.logprob_targets), INPUT_LOGPROB_ROWS):
            targets = e.logprob_targets[start : start + INPUT_LOGPROB_ROWS]
            rows = hidden[first + start : first + start + len(targets)]
            logp = torch.log_softmax(model.compute_logits(rows), dim=-1)
            ids_dev = upload(targets, torch.int64, hidden.device)
            row_lps.extend(logp.gather(1, ids_dev[:, None]).squeeze(1).tolist())
            if e.top_logprobs_num:
                vals, ids = logp.topk(e.top_logprobs_num, dim=-1)
                row_tops.extend(zip(ids.tolist(), vals.tolist(), strict=True))
        lps[i] = row_lps
        tops[i] = row_tops if e.top_logprobs_num else None
    return lps, tops
