"""The model runner: one batch description in, sampled tokens (and logprobs) out.

The scheduler describes each request of a batch with a `ForwardEntry`: which request-slot row it
owns, which tokens it computes now, how many tokens of KV the row already holds, and which KV
slots the new tokens go to. The runner writes the row, builds `ForwardMetadata`, runs the model
(the backend stores the new K/V in the pool), and samples one token per request.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass
from itertools import chain
from typing import TYPE_CHECKING

import torch

from kernels.base import ForwardMetadata
from kernels.grammar_mask import apply_token_bitmask
from kernels.sampling import SamplingBatch, apply_penalties_and_bias, sample
from kernels.spec_verify import accept_greedy, verify_drafts
from runtime.execution.cuda_graph import CudaGraphRunner
from runtime.execution.forward_batch import UPLOADED, BatchPlan, ForwardEntry, plan_batch
from kernels.kv_pool import KVPool, ReqToTokenPool
from runtime.execution.model_setup import LoadedModel
from kernels.transfer import PendingHost, host_tensor, upload, upload_tensor

if TYPE_CHECKING:
    from runtime.execution.tp_worker import StepBroadcaster

__all__ = ["ForwardEntry", "ForwardResult", "ModelRunner", "StepInputs"]

INPUT_LOGPROB_ROWS = 256  # prompt rows scored per lm_head call


@dataclass
class ForwardResult:
    next_ids: torch.Tensor  # int64 [B], on the device
    logprobs: torch.Tensor | None  # fp32 [B], log-prob of each sampled token, when asked for
    top_logprobs: list[tuple[list[int], list[float]]] | None
    input_logprobs: list[list[float] | None]
    input_top_logprobs: list[list[tuple[list[int], list[float]]] | None]
    last_logits: torch.Tensor | None = None  # fp32 [B, vocab], only when asked for
    # Speculative entries: the drafts each accepted (next_ids[i] is the token after them).
    accepted: list[list[int]] | None = None
    # next_ids (and logprobs) on their way to the host: reading them is the step's one sync.
    pending: PendingHost | None = None

    def host_next_ids(self) -> list[int]:
        return self._host()[0]

    def host_logprobs(self) -> list[float] | None:
        return self._host()[1] if self.logprobs is not None else None

    def _host(self) -> list[list]:
        if self.pending is None:
            self.pending = PendingHost([t for t in (self.next_ids, self.logprobs) if t is not None])
        return self.pending.wait()


@dataclass
class StepInputs:
    """One step's device inputs, from one upload of its BatchPlan."""

    plan: BatchPlan
    meta: ForwardMetadata
    input_ids: torch.Tensor  # int64 [T], future-map tokens filled in
    last_rows: torch.Tensor  # int64 [B]
    rows: torch.Tensor  # int64 [B]


class ModelRunner:
    """Owns the model, the KV pool, the request-slot table and the attention backend.

    On CUDA every forward runs on the runner's own stream (the overlap loop's worker thread
    launches it while the scheduler thread works) and ends by queueing the copy of the sampled
    ids to the host; `ForwardResult.host_next_ids()` waits for that copy and nothing else.
    """

    def __init__(self, loaded: LoadedModel) -> None:
        self.loaded = loaded
        self.model = loaded.model
        self.device = loaded.device
        self.page_size = loaded.page_size
        self.vocab_size = loaded.model_config.vocab_size
        self.kv_pool: KVPool = loaded.kv_pool
        self.req_to_token: ReqToTokenPool = loaded.req_to_token
        self.backend = loaded.backend
        # The future map: the token each row sampled last, kept on the device for the overlap
        # loop's next decode. Written after every sampling, read by input_from_future entries.
        # (One entry per table row, the padding row's included.)
        self.future_tokens = torch.zeros(self.req_to_token.size + 1, dtype=torch.int64, device=self.device)
        self.stream = torch.cuda.Stream(self.device) if self.device.type == "cuda" else None
        self.graphs: CudaGraphRunner | None = None
        self.forward_s = 0.0  # wall time inside forward(), for the scheduler-overhead benchmark
        self.forward_count = 0
        # Tensor parallelism: rank 0 sends each step to the other ranks first (runtime/execution/tp_worker.py).
        self.tp = loaded.tp
        self.step_leader: StepBroadcaster | None = None

    def warmup(self) -> None:
        """Run a small prefill and a decode once, so the first request does not pay for oneDNN
        primitive creation. Everything is written to the padding slot 0 and row 0, which hold
        nothing: row 0 is rewritten by whichever request takes it next."""
        tokens = list(range(1, 9))
        self.forward([ForwardEntry(row=0, input_ids=tokens, prefix_len=0, kv_write=[0] * 8, kv_write_start=0)])
        self.forward([ForwardEntry(row=0, input_ids=[1], prefix_len=8, kv_write=[0], kv_write_start=8)])
        self.forward_s, self.forward_count = 0.0, 0

    def init_cuda_graphs(self, max_bs: int, capture: bool = True) -> None:
        """Capture the decode graphs (after warmup(), with the KV pool allocated). `capture=False`
        builds the same replay path with eager stand-ins (CPU tests and the GPU check's dry run)."""
        with torch.inference_mode(), self._on_stream():
            self.graphs = CudaGraphRunner(self, min(max_bs, self.req_to_token.size), capture)

    def lead_tensor_parallel(self) -> None:
        """Rank 0: broadcast every later forward to the other ranks, which run it too."""
        assert self.tp is not None and self.tp.plan.rank == 0
        from runtime.execution.tp_worker import StepBroadcaster

        self.step_leader = StepBroadcaster(self.tp.group)

    def close(self) -> None:
        """Release the other tensor-parallel ranks (rank 0, when its scheduler stops)."""
        if self.step_leader is not None:
            self.step_leader.close()
            self.step_leader = None

    def forward(self, entries: list[ForwardEntry], keep_logits: bool = False) -> ForwardResult:
        start = time.perf_counter()
        if self.step_leader is not None:
            self.step_leader.send(entries, keep_logits)
        try:
            with self._on_stream():
                return self._forward(entries, keep_logits)
        finally:
            self.forward_s += time.perf_counter() - start
            self.forward_count += 1

    @contextlib.contextmanager
    def _on_stream(self) -> Iterator[None]:
        if self.stream is None:
            yield
            return
        # Anything queued on the caller's stream before (pool zeroing, a flush) comes first.
        self.stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(self.stream):
            yield

    @torch.inference_mode()
    def _forward(self, entries: list[ForwardEntry], keep_logits: bool) -> ForwardResult:
        if self.graphs is not None and self.graphs.can_run(entries):
            step, logits = self.graphs.run(entries)
            # The graph's logits buffer is rewritten by the next replay (and by in-place masks).
            return self._sample(entries, step, None, logits.clone(), keep_logits)
        step = self.prepare(entries)
        self.backend.plan(step.meta)
        hidden = self.model.forward(step.input_ids, step.meta.positions, self.backend)
        logits = self.model.compute_logits(hidden.index_select(0, step.last_rows))
        result = self._sample(entries, step, hidden, logits, keep_logits)
        if any(e.draft_ids for e in entries):
            self._verify_drafts(entries, step.plan, hidden, result)
        return result

    def _verify_drafts(self, entries: list[ForwardEntry], plan: BatchPlan, hidden: torch.Tensor,
                       result: ForwardResult) -> None:
        """Replace the sampled token of each speculative entry by its verification's outcome
        (kernels/spec_verify.py); such entries never need penalties, grammars or logprobs."""
        accepted: list[list[int]] = [[] for _ in entries]
        next_ids = result.host_next_ids()
        spec = [i for i, e in enumerate(entries) if e.draft_ids]
        # Every speculative row's logits in one lm_head call, then split by entry.
        rows = [r for i in spec for r in range(plan.qo_indptr[i], plan.qo_indptr[i + 1])]
        logits = self.model.compute_logits(hidden.index_select(0, upload(rows, torch.int64, self.device)))
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
        result.next_ids = upload(next_ids, torch.int64, self.device)
        result.pending = PendingHost([t for t in (result.next_ids, result.logprobs) if t is not None])
        result.accepted = accepted

    def _sample(
        self, entries: list[ForwardEntry], step: StepInputs, hidden: torch.Tensor | None, logits: torch.Tensor,
        keep_logits: bool,
    ) -> ForwardResult:
        """Sample the entries' rows (a graph step's padding rows come after them and are dropped)."""
        sampling = SamplingBatch.build(
            [e.sampling for e in entries],
            [e.output_ids for e in entries],
            self.vocab_size,
            self.device,
            stop_ids=[e.stop_ids for e in entries] if any(e.sampling.min_new_tokens for e in entries) else None,
        )
        if sampling.needs_logit_processing:
            apply_penalties_and_bias(logits, sampling)
        self._apply_grammar(entries, logits)
        top_nums = [e.top_logprobs_num for e in entries]
        out = sample(
            logits, sampling, top_logprobs_num=top_nums, return_logprob=any(e.return_logprob for e in entries)
        )
        if self.tp is not None:  # every rank's future map must hold rank 0's choices
            self.tp.group.broadcast_(out.next_ids)
        self.future_tokens.index_copy_(0, step.rows[: len(entries)], out.next_ids)
        input_lps, input_tops = self._input_logprobs(entries, step.plan, hidden)
        return ForwardResult(
            next_ids=out.next_ids,
            logprobs=out.logprobs,
            top_logprobs=out.top_logprobs if any(top_nums) else None,
            input_logprobs=input_lps,
            input_top_logprobs=input_tops,
            last_logits=logits if keep_logits else None,
            pending=PendingHost([t for t in (out.next_ids, out.logprobs) if t is not None]),
        )

    def _apply_grammar(self, entries: list[ForwardEntry], logits: torch.Tensor) -> None:
        rows = [i for i, e in enumerate(entries) if e.token_bitmask is not None]
        if not rows:
            return
        words = entries[rows[0]].token_bitmask.shape[0]  # type: ignore[union-attr]
        bitmask = torch.full((len(entries), words), -1, dtype=torch.int32)
        for i in rows:
            bitmask[i] = entries[i].token_bitmask  # type: ignore[assignment]
        apply_token_bitmask(logits, upload_tensor(bitmask, logits.device), rows)

    def prepare(self, entries: list[ForwardEntry]) -> StepInputs:
        """Plan the batch on the host, upload it in one copy, write the entries' slots into their
        rows of the request table and gather every request's page list (no host sync)."""
        plan = plan_batch(entries, self.page_size, self.req_to_token.max_context_len)
        arrays = plan.arrays()
        flat = upload(list(chain.from_iterable(arrays)), torch.int64, self.device)
        dev = dict(zip(UPLOADED, flat.split([len(a) for a in arrays])))
        table = self.req_to_token.table
        if plan.table_at:
            table.view(-1).index_copy_(0, dev["table_at"], dev["table_slots"].to(table.dtype))
        input_ids = dev["input_ids"]
        if plan.future_at:
            input_ids.index_copy_(0, dev["future_at"], self.future_tokens.index_select(0, dev["future_rows"]))
        int32 = torch.int32
        meta = ForwardMetadata(
            kv_indices=gather_kv_indices(table, dev["rows"], dev["num_pages"], dev["kv_indptr"], plan),
            positions=dev["positions"],
            out_cache_loc=dev["out_cache_loc"],
            page_size=plan.page_size,
            seq_lens=plan.seq_lens,
            extend_lens=plan.extend_lens,
            qo_indptr_host=host_tensor(plan.qo_indptr, int32, self.device),
            kv_indptr_host=host_tensor(plan.kv_indptr, int32, self.device),
            kv_last_page_len_host=host_tensor(plan.kv_last_page_len, int32, self.device),
        )
        return StepInputs(plan, meta, input_ids, dev["last_rows"], dev["rows"])

    def _input_logprobs(
        self, entries: list[ForwardEntry], plan: BatchPlan, hidden: torch.Tensor | None
    ) -> tuple[list[list[float] | None], list[list[tuple[list[int], list[float]]] | None]]:
        """Log-probs of given input tokens (prompt scoring), computed only where asked (these
        read their results back at once: scoring requests are not the decode fast path)."""
        lps: list[list[float] | None] = [None] * len(entries)
        tops: list[list[tuple[list[int], list[float]]] | None] = [None] * len(entries)
        for i, e in enumerate(entries):
            if not e.logprob_targets:
                continue
            assert hidden is not None, "graph steps never score input tokens"
            first = plan.qo_indptr[i] + e.logprob_start
            row_lps: list[float] = []
            row_tops: list[tuple[list[int], list[float]]] = []
            # In slices: a whole chunk's rows at once would be [chunk, vocab] fp32 (1.2 GB for
            # 2048 rows of a 150k vocabulary).
            for start in range(0, len(e.logprob_targets), INPUT_LOGPROB_ROWS):
                targets = e.logprob_targets[start : start + INPUT_LOGPROB_ROWS]
                rows = hidden[first + start : first + start + len(targets)]
                logp = torch.log_softmax(self.model.compute_logits(rows), dim=-1)
                ids_dev = upload(targets, torch.int64, self.device)
                row_lps.extend(logp.gather(1, ids_dev[:, None]).squeeze(1).tolist())
                if e.top_logprobs_num:
                    vals, ids = logp.topk(e.top_logprobs_num, dim=-1)
                    row_tops.extend(zip(ids.tolist(), vals.tolist()))
            lps[i] = row_lps
            tops[i] = row_tops if e.top_logprobs_num else None
        return lps, tops


def gather_kv_indices(
    table: torch.Tensor, rows: torch.Tensor, num_pages: torch.Tensor, kv_indptr: torch.Tensor, plan: BatchPlan
) -> torch.Tensor:
    """Every request's page ids, request after request (int32 [total pages]), read on the device
    from the request table: page p of request i is table[rows[i], p * page_size] // page_size.

    Sizes come from the host plan (`output_size`), so nothing waits for the device, unlike a
    boolean-mask gather whose result size only the device knows.
    """
    total, ps = plan.total_pages, plan.page_size
    owner = torch.repeat_interleave(num_pages, output_size=total)
    page = torch.arange(total, device=table.device) - kv_indptr.index_select(0, owner)
    slots = table[rows.index_select(0, owner), page * ps]
    return (slots // ps).to(torch.int32) if ps > 1 else slots.to(torch.int32)
