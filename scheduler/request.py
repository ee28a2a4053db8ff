"""A request inside the scheduler: its tokens, its KV, its progress and how it finishes.

KV ownership follows `radix/prefix_cache.py`: `kv[i]` is the KV slot of token i of
`prompt + output`, for every token computed so far; `kv[:prefix_len]` belongs to the tree
(locked through `node`), the rest to the request.

    fill_ids = prompt + output           every token the request knows
    kv       = slots of fill_ids[:len(kv)]
    decode:  the last output token is the one input; it gets the next KV slot
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from radix.tree import TreeNode
from runtime.contracts.messages import GenerateReq, TopLogprobs
from runtime.contracts.sampling import SamplingParams
from scheduler.ngram import NgramIndex

if TYPE_CHECKING:  # xgrammar (and torch with it) loads only once a request has a grammar
    from concurrent.futures import Future

    from xgrammar import CompiledGrammar

    from scheduler.grammar import GrammarState


@dataclass(eq=False)
class Req:
    # What the client asked for (from the GenerateReq; fixed for the request's life).
    rid: str
    prompt: list[int]
    sampling: SamplingParams
    return_logprob: bool = False
    # First prompt position reported in the input logprobs (its entry is None, as in SGLang: only
    # later positions get a value); -1 when no logprobs were asked for.
    logprob_start_len: int = -1
    top_logprobs_num: int = 0
    stream: bool = False
    extra_key: str | None = None
    stop_ids: frozenset[int] = frozenset()  # EOS + stop_token_ids (empty when ignore_eos)
    deadline: float | None = None  # wall-clock seconds; past it the scheduler aborts the request
    priority: int = 0
    pin_prefix_len: int = 0  # prompt tokens to pin in the prefix cache once computed (0: none)
    pin_ttl_s: float = 0.0
    embed: bool = False  # return the prompt's pooled hidden state (with max_new_tokens 0)
    arrival: float = field(default_factory=time.monotonic)

    # Progress: what it produced and how it ended. (Where it is: the queue that holds it,
    # `scheduler/queues.py`.)
    output: list[int] = field(default_factory=list)
    finish_reason: dict[str, Any] | None = None
    matched_stop_token: bool = False
    admitted_at: float | None = None  # monotonic time of its first admission into a prefill
    cached_tokens: int = 0  # prompt tokens found in the prefix cache at admission (before output)
    pinned_tokens: int = 0  # of pin_prefix_len, the tokens its pin writes (not cached before it)
    block_hashes: list[bytes] = field(default_factory=list)  # chained hashes of fill_ids' full blocks
    preemptions: int = 0  # retractions for a more urgent request (scheduler/priority.py)
    embedding: list[float] | None = None  # an embed request's pooled vector, once its prompt is done

    # What it holds while admitted (scheduler/kv_ledger.py); all empty while it waits.
    row: int | None = None  # request-slot row while it holds KV
    row_synced: int = 0  # leading positions of the row known to hold kv[:row_synced]
    kv: list[int] = field(default_factory=list)
    prefix_len: int = 0
    node: TreeNode | None = None

    # Decoding helpers, made on demand.
    ngram: NgramIndex | None = None  # its n-gram index, with speculative decoding
    # Constrained decoding: the compile in flight (while in the grammar queue), then the matcher,
    # which constrains output[grammar_from:]. With sampling.grammar_after_ids, grammar_from is
    # None until the output ends with those ids (the reasoning's end), then the position after.
    grammar_future: Future[CompiledGrammar] | None = None
    grammar: GrammarState | None = None
    grammar_from: int | None = 0

    # Output bookkeeping: what has been sent to the detokenizer.
    sent_ids: int = 0
    sent_first: bool = False
    sent_finish: bool = False  # the finish is reported exactly once (overlap revisits requests)
    output_logprobs: list[float] = field(default_factory=list)
    output_top_logprobs: list[TopLogprobs] = field(default_factory=list)
    input_logprobs: list[float | None] = field(default_factory=list)
    input_top_logprobs: list[TopLogprobs | None] = field(default_factory=list)

    @classmethod
    def from_message(cls, msg: GenerateReq, eos_ids: frozenset[int]) -> Req:
        sp = msg.sampling_params
        stop_ids = frozenset(sp.stop_token_ids or ()) | (frozenset() if sp.ignore_eos else eos_ids)
        return cls(
            rid=msg.rid,
            prompt=list(msg.input_ids),
            sampling=sp,
            return_logprob=msg.return_logprob,
            logprob_start_len=_logprob_start(msg),
            top_logprobs_num=msg.top_logprobs_num if msg.return_logprob else 0,
            stream=msg.stream,
            extra_key=msg.extra_key,
            stop_ids=stop_ids,
            deadline=msg.deadline,
            priority=msg.priority,
            pin_prefix_len=min(msg.pin_prefix_len, len(msg.input_ids)),
            pin_ttl_s=msg.pin_ttl_s,
            embed=msg.embed,
            grammar_from=None if sp.grammar_after_ids else 0,
        )

    @property
    def fill_ids(self) -> list[int]:
        return self.prompt + self.output

    @property
    def computed(self) -> int:
        """Tokens whose KV is in the pool."""
        return len(self.kv)

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    @property
    def remaining_new_tokens(self) -> int:
        return max(self.sampling.max_new_tokens - len(self.output), 0)

    @property
    def active_grammar(self) -> GrammarState | None:
        """The matcher that constrains the next token: None without a grammar, and while the
        output has not reached `sampling.grammar_after_ids` (the reasoning is unconstrained)."""
        return self.grammar if self.grammar_from is not None else None

    def watch_grammar_start(self) -> None:
        """After appending an output token: start the grammar once the output ends with
        `sampling.grammar_after_ids` (the matcher never sees the marker or what precedes it)."""
        marker = self.sampling.grammar_after_ids
        if self.grammar_from is None and marker and self.output[-len(marker):] == marker:
            self.grammar_from = len(self.output)

    def max_prefix_len(self) -> int:
        """The longest prefix a cache hit may cover: at least one token must be computed, and
        the rows scored for input logprobs (from logprob_start_len on) must be computed too."""
        limit = len(self.fill_ids) - 1
        if self.logprob_start_len >= 0:
            limit = min(limit, self.logprob_start_len)
        return limit

    def finish(self, reason: dict[str, Any]) -> None:
        if self.finish_reason is None:
            self.finish_reason = reason

    def abort(self, message: str, param: str | None = None) -> None:
        """Finish with finish_reason abort; `param`: a bad field of the request (the main process
        answers 400 naming it instead of a result)."""
        reason: dict[str, Any] = {"type": "abort", "message": message}
        if param is not None:
            reason["param"] = param
        self.finish(reason)


def _logprob_start(msg: GenerateReq) -> int:
    """SGLang's rule: -1 (the default) reports only the last prompt position."""
    if not msg.return_logprob:
        return -1
    return msg.logprob_start_len if msg.logprob_start_len >= 0 else len(msg.input_ids) - 1


def needs_history(req: Req) -> bool:
    """Sampling of this request's next token reads its output so far."""
    sp = req.sampling
    return (
        sp.frequency_penalty != 0.0
        or sp.presence_penalty != 0.0
        or sp.repetition_penalty != 1.0
        or sp.min_new_tokens > len(req.output)
        or sp.seed is not None
    )
