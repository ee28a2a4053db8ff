"""Turn the requests touched by one step into one `BatchTokenOut` (deltas since the last send)."""

from __future__ import annotations

from dataclasses import fields

from runtime.contracts.messages import BatchTokenOut
from scheduler.batch import ScheduledBatch
from scheduler.interfaces import SchedulerIO
from scheduler.lifecycle import Lifecycle
from scheduler.queues import ReqQueues
from scheduler.request import Req

DECODE_CONTEXT_TOKENS = 5  # prompt tokens the detokenizer decodes as left context
# A request nobody streams still sends its tokens this often (as SGLang does), so the
# detokenizer's work and each message stay small for long outputs.
NONSTREAM_INTERVAL = 50


def has_news(req: Req, stream_interval: int = 1) -> bool:
    """Something is due to the detokenizer: the first token, a finish (or a prefill-only result),
    or `stream_interval` new tokens since the last send (the request's own interval if it set
    one; at least NONSTREAM_INTERVAL when it does not stream)."""
    if req.finished:
        return not req.sent_finish
    new = len(req.output) - req.sent_ids
    if new <= 0:
        return False
    if not req.sent_first:
        return True
    every = req.sampling.stream_interval or stream_interval
    return new >= (every if req.stream else max(every, NONSTREAM_INTERVAL))


class Outbox:
    """Sends one step's news to the detokenizer; a request whose end went out is forgotten."""

    def __init__(self, io: SchedulerIO, queues: ReqQueues, lifecycle: Lifecycle, stream_interval: int) -> None:
        self.io = io
        self.queues = queues
        self.lifecycle = lifecycle
        self.stream_interval = stream_interval  # the server's default (--stream-interval)

    def send(self, batch: ScheduledBatch | None) -> None:
        """Report the requests ended outside a forward and those of `batch` that have news."""
        candidates = dict.fromkeys([*self.queues.take_ended(), *(batch.reqs if batch else [])])
        reqs = [r for r in candidates if has_news(r, self.stream_interval)]
        for req in reqs:
            if req.finished:
                self.lifecycle.forget(req)
        if reqs:
            self.io.send_tokens(build_batch_out(reqs))


def build_batch_out(reqs: list[Req]) -> BatchTokenOut:
    out = BatchTokenOut(**{f.name: [] for f in fields(BatchTokenOut)})
    for req in reqs:
        _append(out, req)
    return out


def _append(out: BatchTokenOut, req: Req) -> None:
    sp, start, first = req.sampling, req.sent_ids, not req.sent_first
    out.rids.append(req.rid)
    out.finished_reasons.append(req.finish_reason)
    out.new_ids.append(req.output[start:])
    out.decode_prefix.append(req.prompt[-DECODE_CONTEXT_TOKENS:] if first else None)
    out.prompt_tokens.append(len(req.prompt))
    out.completion_tokens.append(len(req.output))
    out.cached_tokens.append(req.cached_tokens)
    out.skip_special_tokens.append(sp.skip_special_tokens)
    out.spaces_between_special_tokens.append(sp.spaces_between_special_tokens)
    out.stop_strs.append(sp.stop_strs if first else [])  # the detokenizer keeps a rid's first options
    out.no_stop_trim.append(sp.no_stop_trim)
    out.matched_stop_token.append(req.matched_stop_token and req.finished)
    if req.return_logprob:
        out.output_logprobs.append(req.output_logprobs[start:])
        out.output_top_logprobs.append(req.output_top_logprobs[start:] if req.top_logprobs_num else None)
    else:
        out.output_logprobs.append(None)
        out.output_top_logprobs.append(None)
    if req.return_logprob and first:
        begin = req.logprob_start_len if req.logprob_start_len >= 0 else len(req.prompt)
        out.input_ids_for_logprobs.append(req.prompt[begin:])
        out.input_logprobs.append(list(req.input_logprobs))
        out.input_top_logprobs.append(list(req.input_top_logprobs) if req.top_logprobs_num else None)
    else:
        out.input_ids_for_logprobs.append(None)
        out.input_logprobs.append(None)
        out.input_top_logprobs.append(None)
    waited = req.admitted_at - req.arrival if first and req.admitted_at is not None else None
    out.queue_times.append(waited)
    out.pinned_tokens.append(req.pinned_tokens)
    out.embeddings.append(req.embedding if req.finished else None)
    req.sent_ids = len(req.output)
    req.sent_first = True
    req.sent_finish = req.finished
