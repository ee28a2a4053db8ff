"""A scheduled batch and the runner entries its requests turn into."""

from __future__ import annotations

from dataclasses import dataclass, field

from runtime.execution.forward_batch import ForwardEntry
from scheduler.interfaces import StepResult
from scheduler.request import Req


@dataclass
class ScheduledBatch:
    """One forward: prefill entries first, then decode entries. A mixed batch (SGLang's mixed
    chunk) has both: the running requests decode in the same forward as a new prefill."""

    is_prefill: bool  # holds prefill entries (then it is not overlapped with the next batch)
    reqs: list[Req] = field(default_factory=list)
    entries: list[ForwardEntry] = field(default_factory=list)
    num_prefill: int = 0  # reqs[:num_prefill] are prefilling, the rest decoding

    def add(self, req: Req, entry: ForwardEntry, prefill: bool) -> None:
        assert not prefill or self.num_prefill == len(self.reqs), "prefill entries come first"
        self.reqs.append(req)
        self.entries.append(entry)
        self.num_prefill += prefill

    def is_prefill_entry(self, i: int) -> bool:
        return i < self.num_prefill


def _entry(req: Req, start: int, n: int, input_ids: list[int] | None = None) -> ForwardEntry:
    """Compute tokens [start, start + n) of `req`; its kv already covers them."""
    assert req.row is not None and len(req.kv) == start + n
    write_from = min(req.row_synced, start)
    req.row_synced = start + n
    return ForwardEntry(
        row=req.row,
        input_ids=input_ids if input_ids is not None else req.fill_ids[start : start + n],
        prefix_len=start,
        kv_write=req.kv[write_from:],
        kv_write_start=write_from,
        sampling=req.sampling,
        output_ids=req.output,
        stop_ids=sorted(req.stop_ids),
        return_logprob=req.return_logprob,
        top_logprobs_num=req.top_logprobs_num,
    )


def prefill_entry(req: Req, extend: int) -> ForwardEntry:
    """The next `extend` tokens of a request's prompt (its kv was just extended by `extend`)."""
    start = req.computed - extend
    entry = _entry(req, start, extend)
    entry.generated = False
    _plan_input_logprobs(req, entry, start, start + extend)
    if req.computed == len(req.fill_ids):  # the last chunk: its sampled token is the next one
        _constrain(req, entry)
        entry.embed = req.embed
    return entry


def decode_entry(req: Req) -> ForwardEntry:
    """One decode step: the newest token goes in at the newest KV slot.

    Under overlap the newest token may still be in flight (sampled by the forward that is
    running now, not yet appended to `output`): the runner then reads it from the future map.
    """
    pos = req.computed - 1
    if pos < len(req.fill_ids):
        entry = _entry(req, pos, 1)
    else:
        assert pos == len(req.fill_ids), f"{req.rid}: two tokens in flight"
        assert req.grammar is None, "a constrained request's mask needs its previous token"
        entry = _entry(req, pos, 1, input_ids=[0])
        entry.input_from_future = True
    entry.generated = True
    _constrain(req, entry)
    return entry


def speculative_entry(req: Req, drafts: list[int]) -> ForwardEntry:
    """A decode step that also verifies `drafts`: [newest token, *drafts] at their new slots."""
    pos = req.computed - 1 - len(drafts)
    entry = _entry(req, pos, 1 + len(drafts), input_ids=[req.fill_ids[pos], *drafts])
    entry.draft_ids = list(drafts)
    entry.generated = True
    return entry


def _constrain(req: Req, entry: ForwardEntry) -> None:
    """Give a constrained request's entry the token bitmask of its grammar's current state
    (none before the grammar starts: see `Req.active_grammar`)."""
    grammar = req.active_grammar
    if grammar is not None:
        entry.token_bitmask = grammar.next_mask()


def _plan_input_logprobs(req: Req, entry: ForwardEntry, a: int, b: int) -> None:
    """Score prompt positions (begin, len(prompt)): row r predicts prompt[r + 1].

    Position `begin` itself is reported as None (SGLang's format), so the rows of this chunk
    [a, b) that score a reported token are r in [max(a, begin), min(b, len(prompt) - 1)).
    """
    if req.logprob_start_len < 0 or req.sent_first:
        return
    begin, plen = req.logprob_start_len, len(req.prompt)
    first, end = max(a, begin), min(b, plen - 1)
    if first < end:
        entry.logprob_start = first - a
        entry.logprob_targets = req.prompt[first + 1 : end + 1]


def record_input_logprobs(req: Req, entry: ForwardEntry, result: StepResult, i: int) -> None:
    """Append this chunk's input logprobs to the request (None for position logprob_start_len)."""
    if req.logprob_start_len < 0 or req.sent_first:
        return
    if entry.prefix_len <= req.logprob_start_len < entry.seq_len:  # the chunk holding `begin`
        req.input_logprobs.append(None)
        req.input_top_logprobs.append(None)
    lps = result.input_logprobs[i]
    if lps is None:
        return
    req.input_logprobs.extend(lps)
    tops = result.input_top_logprobs[i]
    if req.top_logprobs_num and tops is not None:
        req.input_top_logprobs.extend([list(ids), list(vals)] for ids, vals in tops)
