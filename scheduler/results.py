"""Result processing: a forward's sampled tokens into its requests, then each request onward
(a middle chunk stays chunked, a finished prompt starts running, a finished request lets go of
its KV)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from scheduler.batch import ScheduledBatch, record_input_logprobs
from scheduler.batch_log import BatchLog
from scheduler.finish import check_finished
from scheduler.interfaces import StepResult
from scheduler.kv_ledger import KVLedger
from scheduler.queues import ReqQueues
from scheduler.request import Req
from scheduler.speculative import Speculator


class ResultProcessor:
    """Applies a forward's result to its batch's requests."""

    def __init__(
        self,
        queues: ReqQueues,
        ledger: KVLedger,
        speculator: Speculator | None,
        decode: Callable[[list[int], bool], str],
        batch_log: BatchLog,
    ) -> None:
        self.queues = queues
        self.ledger = ledger
        self.speculator = speculator
        self.decode = decode  # token ids -> text, for stop strings (scheduler/finish.py)
        self.batch_log = batch_log

    def process(self, batch: ScheduledBatch, result: StepResult) -> None:
        next_ids = result.host_next_ids()  # the step's one wait for the device
        logprobs = result.host_logprobs()
        for i, req in enumerate(batch.reqs):
            if req.finished:  # aborted meanwhile, or (overlap) finished by the previous step
                continue
            prefill = batch.is_prefill_entry(i)
            if prefill and not self._prompt_done(req, batch, result, i):
                continue
            drafts = batch.entries[i].draft_ids
            if drafts and result.accepted is not None:
                self.append_speculated(req, drafts, result.accepted[i], next_ids[i], result, i)
            else:
                self.append_token(req, next_ids[i], result, i, logprobs)
            self._move_on(req, prefill)
        self.batch_log.record(batch)

    def _prompt_done(self, req: Req, batch: ScheduledBatch, result: StepResult, i: int) -> bool:
        """After a prefill entry: True when its sampled token is the request's next one."""
        record_input_logprobs(req, batch.entries[i], result, i)
        if req.computed < len(req.fill_ids):  # a middle chunk: publish it, keep going
            self.ledger.cache_unfinished(req)
            return False
        if req.sampling.max_new_tokens == 0:  # prefill-only (scoring, cache warm-up, embeddings)
            if req.embed and result.embeddings is not None:
                req.embedding = result.embeddings[i]
            req.finish({"type": "length", "length": 0})
            self.ledger.release(req)
            return False
        return True

    def _move_on(self, req: Req, prefill: bool) -> None:
        """A finished request lets go of its KV; a finished prompt starts running."""
        if req.finished:
            if not prefill:
                self.queues.stop_running(req)
            self.ledger.release(req)
        elif prefill:
            self.ledger.cache_unfinished(req)
            self.queues.start_running(req)

    def append_token(
        self, req: Req, token: int, result: StepResult, i: int, logprobs: list[float] | None
    ) -> None:
        req.output.append(token)
        grammar = req.active_grammar
        if grammar is not None and not grammar.accept(token):
            req.abort(f"the grammar rejected token {token}")
        elif grammar is None and req.grammar is not None:
            req.watch_grammar_start()
        if req.return_logprob and logprobs is not None:
            req.output_logprobs.append(logprobs[i])
            if req.top_logprobs_num and result.top_logprobs is not None:
                ids, vals = result.top_logprobs[i]
                req.output_top_logprobs.append([list(ids), list(vals)])
        check_finished(req, self.decode)
        if not req.finished and grammar is not None and grammar.is_terminated():
            req.matched_stop_token = token in req.stop_ids
            req.finish({"type": "stop", "matched": token})

    def append_speculated(
        self, req: Req, drafts: list[int], accepted: Sequence[int], after: int, result: StepResult, i: int
    ) -> None:
        """The accepted drafts and the token after them, while the request runs; then its KV
        keeps the positions computed for tokens it kept (scheduler/speculative.py)."""
        assert self.speculator is not None
        start = len(req.fill_ids)  # the verify step computed positions start - 1 .. start - 1 + k
        appended = 0
        for token in [*accepted, after]:
            self.append_token(req, token, result, i, None)
            appended += 1
            if req.finished:
                break
        self.ledger.trim(req, start + min(len(accepted), appended))
        self.speculator.record(len(drafts), len(accepted))
