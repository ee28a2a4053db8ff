"""The model runner: one batch description in, sampled tokens (and logprobs) out.

The scheduler describes each request of a batch with a `ForwardEntry`: which request-slot row it
owns, which tokens it computes now, how many tokens of KV the row already holds, and which KV
slots the new tokens go to. The runner writes the row, builds `ForwardMetadata`, runs the model
(the backend stores the new K/V in the pool), and samples one token per request.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from kernels.base import ForwardMetadata
from kernels.grammar_mask import apply_token_bitmask
from kernels.sampling import SamplingBatch, apply_penalties_and_bias, sample
from runtime.kv_pool import KVPool, ReqToTokenPool
from runtime.model_setup import LoadedModel
from runtime.sampling import SamplingParams


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

    @property
    def seq_len(self) -> int:
        return self.prefix_len + len(self.input_ids)


@dataclass
class ForwardResult:
    next_ids: torch.Tensor  # int64 [B]
    logprobs: torch.Tensor | None  # fp32 [B], log-prob of each sampled token, when asked for
    top_logprobs: list[tuple[list[int], list[float]]] | None
    input_logprobs: list[list[float] | None]
    input_top_logprobs: list[list[tuple[list[int], list[float]]] | None]
    last_logits: torch.Tensor | None = None  # fp32 [B, vocab], only when asked for


class ModelRunner:
    """Owns the model, the KV pool, the request-slot table and the attention backend."""

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
        self.future_tokens = torch.zeros(self.req_to_token.size, dtype=torch.int64, device=self.device)
        self.forward_s = 0.0  # wall time inside forward(), for the scheduler-overhead benchmark
        self.forward_count = 0

    def warmup(self) -> None:
        """Run a small prefill and a decode once, so the first request does not pay for oneDNN
        primitive creation. Everything is written to the padding slot 0 and row 0, which hold
        nothing: row 0 is rewritten by whichever request takes it next."""
        tokens = list(range(1, 9))
        self.forward([ForwardEntry(row=0, input_ids=tokens, prefix_len=0, kv_write=[0] * 8, kv_write_start=0)])
        self.forward([ForwardEntry(row=0, input_ids=[1], prefix_len=8, kv_write=[0], kv_write_start=8)])
        self.forward_s, self.forward_count = 0.0, 0

    def forward(self, entries: list[ForwardEntry], keep_logits: bool = False) -> ForwardResult:
        start = time.perf_counter()
        try:
            return self._forward(entries, keep_logits)
        finally:
            self.forward_s += time.perf_counter() - start
            self.forward_count += 1

    @torch.inference_mode()
    def _forward(self, entries: list[ForwardEntry], keep_logits: bool) -> ForwardResult:
        assert entries, "empty batch"
        meta = self.build_metadata(entries)
        self.backend.plan(meta)
        input_ids = self._input_ids(entries, meta)
        hidden = self.model.forward(input_ids, meta.positions, self.backend)
        last_rows = torch.tensor(meta.qo_indptr[1:].tolist(), device=self.device) - 1
        logits = self.model.compute_logits(hidden.index_select(0, last_rows))
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
        rows = torch.tensor([e.row for e in entries], dtype=torch.int64, device=self.device)
        self.future_tokens.index_copy_(0, rows, out.next_ids)
        input_lps, input_tops = self._input_logprobs(entries, meta, hidden)
        return ForwardResult(
            next_ids=out.next_ids,
            logprobs=out.logprobs,
            top_logprobs=out.top_logprobs if any(top_nums) else None,
            input_logprobs=input_lps,
            input_top_logprobs=input_tops,
            last_logits=logits if keep_logits else None,
        )

    def _apply_grammar(self, entries: list[ForwardEntry], logits: torch.Tensor) -> None:
        rows = [i for i, e in enumerate(entries) if e.token_bitmask is not None]
        if not rows:
            return
        words = entries[rows[0]].token_bitmask.shape[0]  # type: ignore[union-attr]
        bitmask = torch.full((len(entries), words), -1, dtype=torch.int32)
        for i in rows:
            bitmask[i] = entries[i].token_bitmask  # type: ignore[assignment]
        apply_token_bitmask(logits, bitmask.to(logits.device), rows)

    def _input_ids(self, entries: list[ForwardEntry], meta: ForwardMetadata) -> torch.Tensor:
        ids = torch.tensor([t for e in entries for t in e.input_ids], dtype=torch.int64, device=self.device)
        future = [i for i, e in enumerate(entries) if e.input_from_future]
        if future:
            starts = meta.qo_indptr.tolist()
            at = torch.tensor([starts[i] for i in future], dtype=torch.int64, device=self.device)
            rows = torch.tensor([entries[i].row for i in future], dtype=torch.int64, device=self.device)
            ids.index_copy_(0, at, self.future_tokens.index_select(0, rows))
        return ids

    def build_metadata(self, entries: list[ForwardEntry]) -> ForwardMetadata:
        """Write the entries' slots into their rows and describe the batch for the backend."""
        ps, table = self.page_size, self.req_to_token
        for e in entries:
            assert e.kv_write_start + len(e.kv_write) == e.seq_len, (
                f"row {e.row}: kv_write covers [{e.kv_write_start}, "
                f"{e.kv_write_start + len(e.kv_write)}) but the sequence has {e.seq_len} tokens"
            )
            assert e.kv_write_start <= e.prefix_len, "the new tokens' slots must be written"
            table.write(e.row, e.kv_write_start, e.kv_write)
        seq_lens = [e.seq_len for e in entries]
        extend_lens = [len(e.input_ids) for e in entries]
        num_pages = [(s + ps - 1) // ps for s in seq_lens]
        rows = torch.tensor([e.row for e in entries], dtype=torch.int64, device=self.device)
        # First slot of every page of every request, as [B, max_pages], then the valid ones.
        max_pages = max(num_pages)
        first_slots = table.table.index_select(0, rows)[:, : max_pages * ps : ps]
        valid = torch.arange(max_pages, device=self.device)[None, :] < torch.tensor(
            num_pages, device=self.device
        )[:, None]
        kv_indices = (first_slots[valid] // ps).to(torch.int32)
        out_cache_loc = [s for e in entries for s in e.kv_write[e.prefix_len - e.kv_write_start :]]
        positions = [p for e in entries for p in range(e.prefix_len, e.seq_len)]
        return ForwardMetadata(
            qo_indptr=_indptr(extend_lens, self.device),
            kv_indptr=_indptr(num_pages, self.device),
            kv_indices=kv_indices,
            kv_last_page_len=torch.tensor(
                [s - (n - 1) * ps for s, n in zip(seq_lens, num_pages)], dtype=torch.int32, device=self.device
            ),
            positions=torch.tensor(positions, dtype=torch.int64, device=self.device),
            out_cache_loc=torch.tensor(out_cache_loc, dtype=torch.int64, device=self.device),
            page_size=ps,
            seq_lens=seq_lens,
            extend_lens=extend_lens,
        )

    def _input_logprobs(
        self, entries: list[ForwardEntry], meta: ForwardMetadata, hidden: torch.Tensor
    ) -> tuple[list[list[float] | None], list[list[tuple[list[int], list[float]]] | None]]:
        """Log-probs of given input tokens (prompt scoring), computed only where asked."""
        lps: list[list[float] | None] = [None] * len(entries)
        tops: list[list[tuple[list[int], list[float]]] | None] = [None] * len(entries)
        starts = meta.qo_indptr.tolist()
        for i, e in enumerate(entries):
            if not e.logprob_targets:
                continue
            first = starts[i] + e.logprob_start
            rows = hidden[first : first + len(e.logprob_targets)]
            logp = torch.log_softmax(self.model.compute_logits(rows), dim=-1)
            targets = torch.tensor(e.logprob_targets, device=self.device)
            lps[i] = logp.gather(1, targets[:, None]).squeeze(1).tolist()
            if e.top_logprobs_num:
                vals, ids = logp.topk(e.top_logprobs_num, dim=-1)
                tops[i] = list(zip(ids.tolist(), vals.tolist()))
        return lps, tops


def _indptr(lengths: list[int], device: torch.device) -> torch.Tensor:
    ptr = [0]
    for n in lengths:
        ptr.append(ptr[-1] + n)
    return torch.tensor(ptr, dtype=torch.int32, device=device)
