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
from typing import Protocol

import torch

from kernels.grammar_mask import apply_row_bitmasks
from kernels.kv_pool import KVPool, ReqToTokenPool
from kernels.sampling import SamplingBatch, apply_penalties_and_bias, sample
from runtime.execution.cuda_graph import CudaGraphRunner
from runtime.execution.draft_verify import apply_draft_verification
from runtime.execution.forward_batch import ForwardEntry
from runtime.execution.forward_result import ForwardResult
from runtime.execution.input_logprobs import input_logprobs
from runtime.execution.model_setup import LoadedModel
from runtime.execution.step_inputs import StepInputs, prepare_step
from runtime.execution.tp_step import SingleRank, StepFollower, StepHook, StepLeader

__all__ = ["ForwardEntry", "ForwardResult", "ModelRunner", "StepInputs"]


class StepMarks(Protocol):
    """Called on the runner's stream at the two ends of a step's device work (CUDA events there):
    between one step's end and the next one's beginning the GPU has nothing of ours queued."""

    def device_work_begins(self) -> None: ...
    def device_work_ends(self) -> None: ...


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
        self.step_marks: StepMarks | None = None  # the GPU check's timer of each step's device work
        self.forward_count = 0
        # Tensor parallelism joins through this hook (runtime/execution/tp_step.py): followers
        # until `lead_tensor_parallel` makes rank 0 the leader.
        self.tp = loaded.tp
        self.step_hook: StepHook = SingleRank() if loaded.tp is None else StepFollower(loaded.tp.group)

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
        self.step_hook = StepLeader(self.tp.group)

    def close(self) -> None:
        """Release the other tensor-parallel ranks (rank 0, when its scheduler stops)."""
        self.step_hook.close()
        self.step_hook = SingleRank()

    @property
    def engines(self) -> list[dict[str, str]]:
        """The CPU ops' engines chosen at load, and why (runtime/execution/engines.py)."""
        return [choice.as_dict() for choice in self.loaded.engines]

    def forward(self, entries: list[ForwardEntry], keep_logits: bool = False) -> ForwardResult:
        start = time.perf_counter()
        self.step_hook.before_forward(entries, keep_logits)
        try:
            with self._on_stream():
                result = self._forward(entries, keep_logits)
                if self.step_marks is not None:
                    self.step_marks.device_work_ends()
            if keep_logits and self.stream is not None:
                self._hand_over(result)
            return result
        finally:
            self.forward_s += time.perf_counter() - start
            self.forward_count += 1

    def _hand_over(self, result: ForwardResult) -> None:
        """The caller reads the kept logits on its own stream, while the forward ran on ours: order
        the caller's stream after this forward (a device-side wait, no host sync), and tell the
        allocator the tensor is in use there, so our stream does not reuse its memory first."""
        assert self.stream is not None and result.last_logits is not None
        caller = torch.cuda.current_stream(self.device)
        caller.wait_stream(self.stream)
        result.last_logits.record_stream(caller)

    def _device_work_begins(self) -> None:
        """The step's host preparation (inputs, attention plan) is done: the model runs next."""
        if self.step_marks is not None:
            self.step_marks.device_work_begins()

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
            step = self.graphs.prepare(entries)
            self._device_work_begins()
            logits = self.graphs.replay(step, len(entries))
            # Sampling works in place on the graphs' shared logits buffer, before the next replay
            # (on this stream) rewrites it; only logits handed to the caller need their own copy.
            return self._sample(entries, step, None, logits.clone() if keep_logits else logits, keep_logits)
        step = self.prepare(entries)
        self.backend.plan(step.meta)
        self._device_work_begins()
        hidden = self.model.forward(step.input_ids, step.meta.positions, self.backend)
        logits = self.model.compute_logits(hidden.index_select(0, step.last_rows))
        result = self._sample(entries, step, hidden, logits, keep_logits)
        if any(e.embed for e in entries):
            result.embeddings = last_hidden_rows(entries, hidden, step.last_rows)
        if any(e.draft_ids for e in entries):
            apply_draft_verification(self.model, entries, step.plan, hidden, result)
        return result

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
        apply_row_bitmasks(logits, [e.token_bitmask for e in entries])  # constrained decoding
        top_nums = [e.top_logprobs_num for e in entries]
        out = sample(
            logits, sampling, top_logprobs_num=top_nums, return_logprob=any(e.return_logprob for e in entries),
            truncated=self.loaded.sampler,
        )
        self.step_hook.agree_on(out.next_ids)  # every rank's future map must hold rank 0's choices
        self.future_tokens.index_copy_(0, step.rows[: len(entries)], out.next_ids)
        input_lps, input_tops = input_logprobs(self.model, entries, step.plan, hidden)
        result = ForwardResult(
            next_ids=out.next_ids,
            logprobs=out.logprobs,
            top_logprobs=out.top_logprobs if any(top_nums) else None,
            input_logprobs=input_lps,
            input_top_logprobs=input_tops,
            last_logits=logits if keep_logits else None,
        )
        result.start_host_copy()  # queued now, behind this step's work: the step's one sync reads it
        return result

    def prepare(self, entries: list[ForwardEntry], page_list: torch.Tensor | None = None) -> StepInputs:
        """The step's device inputs (step_inputs.prepare_step), no host sync."""
        return prepare_step(entries, self.page_size, self.req_to_token, self.future_tokens, self.device, page_list)


def last_hidden_rows(
    entries: list[ForwardEntry], hidden: torch.Tensor, last_rows: torch.Tensor
) -> list[list[float] | None]:
    """The embed entries' last-row hidden states (after the final norm), fp32 on the host: the
    decoder's last-token pooling. Other entries get None."""
    wanted = [i for i, e in enumerate(entries) if e.embed]
    picks = last_rows.index_select(0, torch.tensor(wanted, dtype=torch.int64, device=last_rows.device))
    vectors = iter(hidden.index_select(0, picks).float().cpu().tolist())
    return [next(vectors) if e.embed else None for e in entries]
