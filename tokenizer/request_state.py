"""The main process's record of one request (`ReqState`), folded from the detokenizer's
`BatchStrOut` entries, what its consumer has not taken yet (`take_delta`), the wake-up `Group` of
one submission, and the logprob shapes of answers: the wire's (runtime/contracts/messages.py)
turned into `[[logprob, token_id, text_or_None], ...]` lists. No sockets: the TokenizerManager
owns those.

Everything a state holds only grows (text pieces, ids, logprob entries), and its one consumer
keeps a cursor into each list, so taking an update costs what is new, never the whole output.

Logprob lists are built on the receive loop when small; from OFFLOAD_DECODE_IDS entries (a long
prompt's input logprobs with their top-k, each entry decoded to its own text) they are built on
the PromptEncoder's worker thread, so the receive loop never waits for them (`_fold_later`).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from runtime.contracts.messages import BatchStrOut, GenerateReq
from tokenizer.admission import OFFLOAD_DECODE_IDS

logger = logging.getLogger("radixserve.tokenizer")

TopLogprobsWire = Sequence[Sequence[Any]]  # [[token ids...], [logprobs...]]
LogprobEntry = list[Any]  # [logprob | None, token_id, text | None]


# ---------------------------------------------------------------- response shapes


def token_logprobs(
    logprobs: Sequence[float | None], ids: Sequence[int], texts: Sequence[str | None]
) -> list[LogprobEntry]:
    """`[[logprob, id, text_or_None], ...]`, one entry per position."""
    return [[lp, tid, text] for lp, tid, text in zip(logprobs, ids, texts)]


def top_logprobs(
    tops: Sequence[TopLogprobsWire | None], decode: Callable[[list[int]], list[str | None]]
) -> list[list[LogprobEntry] | None]:
    """Per position, the top-k as `[[logprob, id, text_or_None], ...]` (None where absent).

    `decode(ids)` returns one text (or None) per id; it is called once for the whole list.
    """
    flat_ids = [int(t) for top in tops if top is not None for t in top[0]]
    texts = iter(decode(flat_ids))
    out: list[list[LogprobEntry] | None] = []
    for top in tops:
        if top is None:
            out.append(None)
            continue
        ids, lps = top[0], top[1]
        out.append([[lp, tid, next(texts)] for tid, lp in zip(ids, lps)])
    return out


# ---------------------------------------------------------------- per-request state


class Group:
    """The states of one generate call: one wake-up event and the indices that have news.

    News for several requests (or several updates of one) between two wake-ups collapse into
    one `take()`, so a slow consumer sees the latest cumulative output, never a backlog. A held
    index (its logprobs are being built off the loop) keeps its news until it is released.
    """

    def __init__(self) -> None:
        self.size = 0
        self._event = asyncio.Event()
        self._dirty: dict[int, None] = {}  # an ordered set
        self._held: dict[int, int] = {}  # index -> holds not yet released

    def add(self) -> int:
        self.size += 1
        return self.size - 1

    def mark(self, index: int) -> None:
        self._dirty[index] = None
        if index not in self._held:
            self._event.set()

    def hold(self, index: int) -> None:
        self._held[index] = self._held.get(index, 0) + 1

    def release(self, index: int) -> None:
        left = self._held.pop(index) - 1
        if left:
            self._held[index] = left
        elif index in self._dirty:
            self._event.set()

    async def take(self) -> list[int]:
        """Wait for news; return the indices that have some (maybe none: a spurious wake)."""
        await self._event.wait()
        self._event.clear()
        news = [i for i in self._dirty if i not in self._held]
        for i in news:
            del self._dirty[i]
        return news


@dataclass(slots=True, eq=False)
class ReqState:
    """What the main process knows of one request sent to the scheduler (SGLang's ReqState).

    `req.rid` is the server-made internal rid; `label` is the id the client sees, and `names`
    the client rids that abort it (tokenizer/labels.py)."""

    req: GenerateReq
    group: Group
    index: int
    return_text_in_logprobs: bool
    label: str = ""
    names: tuple[str, ...] = ()
    owner: str = ""  # who may abort it by name (tokenizer/openai/responses/store.py owner_key)
    created: float = field(default_factory=time.perf_counter)
    pieces: list[str] = field(default_factory=list)  # the output text, as the detokenizer sent it
    output_ids: list[int] = field(default_factory=list)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    pinned_tokens: int = 0  # prompt tokens its cache pin wrote (not cached before): Anthropic's cache writes
    finish_reason: dict[str, Any] | None = None
    finished: bool = False
    finished_time: float | None = None
    first_token_time: float | None = None
    queue_time: float | None = None  # seconds it waited in the scheduler before its first forward
    sent: bool = False
    error: str | None = None  # set by fail_all: the consumer raises RuntimeCrashed(error)
    input_token_logprobs: list[LogprobEntry] = field(default_factory=list)
    output_token_logprobs: list[LogprobEntry] = field(default_factory=list)
    input_top_logprobs: list[list[LogprobEntry] | None] | None = None
    output_top_logprobs: list[list[LogprobEntry] | None] | None = None
    folding: asyncio.Task[None] | None = None  # the last logprob fold still running off the loop
    taken: Cursor = field(default_factory=lambda: Cursor())  # what the consumer has taken
    embedding: list[float] | None = None  # an embed request's pooled vector (BatchStrOut.embeddings)

    @classmethod
    def for_request(
        cls, req: GenerateReq, group: Group, text_in_logprobs: bool, label: str | None = None,
        names: tuple[str, ...] = (),
    ) -> ReqState:
        """`label` defaults to the internal rid, `names` to the label alone."""
        label = req.rid if label is None else label
        state = cls(req, group, group.add(), text_in_logprobs, label, names or (label,),
                    prompt_tokens=len(req.input_ids))
        if req.return_logprob and req.top_logprobs_num > 0:
            state.input_top_logprobs, state.output_top_logprobs = [], []
        return state

    @property
    def rid(self) -> str:
        return self.req.rid

    @property
    def stream(self) -> bool:
        return self.req.stream

    def finish(self, reason: dict[str, Any], now: float) -> None:
        self.finished, self.finish_reason, self.finished_time = True, reason, now


TopLogprobs = list[list[LogprobEntry] | None]
TokenTexts = Callable[[list[int]], list[str | None]]


@dataclass(slots=True)
class LogprobParts:
    """The logprob lists that one BatchStrOut entry brings (None: not in that entry)."""

    input_tokens: list[LogprobEntry] | None = None
    input_tops: TopLogprobs | None = None
    output_tokens: list[LogprobEntry] | None = None
    output_tops: TopLogprobs | None = None


Offload = Callable[[Callable[[], LogprobParts]], Awaitable[LogprobParts]]


def apply_output(state: ReqState, out: BatchStrOut, i: int, now: float, texts: TokenTexts,
                 offload: Offload | None = None) -> None:
    """Fold entry `i` of a BatchStrOut into the state (text and ids accumulate). With `offload`
    (run a job on a worker thread), large logprob lists are built there (`_fold_later`)."""
    new_ids = out.output_ids[i]
    if out.texts[i]:
        state.pieces.append(out.texts[i])
    state.output_ids.extend(new_ids)
    if new_ids and state.first_token_time is None:
        state.first_token_time = now
    state.prompt_tokens = out.prompt_tokens[i]
    state.completion_tokens = out.completion_tokens[i]
    state.cached_tokens = out.cached_tokens[i]
    if i < len(out.pinned_tokens):  # NOTE: an older sender's message has none
        state.pinned_tokens = out.pinned_tokens[i]
    if i < len(out.queue_times) and out.queue_times[i] is not None:
        state.queue_time = out.queue_times[i]
    if i < len(out.embeddings) and out.embeddings[i] is not None:
        state.embedding = out.embeddings[i]
    if state.req.return_logprob:
        _apply_logprobs(state, out, i, texts if state.return_text_in_logprobs else _no_texts, offload)
    reason = out.finished_reasons[i]
    if reason is not None:
        state.finish(reason, now)


def _apply_logprobs(state: ReqState, out: BatchStrOut, i: int, texts: TokenTexts,
                    offload: Offload | None) -> None:
    build = functools.partial(_logprob_parts, out, i, texts, state.input_top_logprobs is not None)
    if offload is None or (state.folding is None and _entries(out, i, state.req.top_logprobs_num)
                           < OFFLOAD_DECODE_IDS):
        _assign(state, build())
        return
    # NOTE: the other fields of this entry are applied now; the logprobs follow once built, in
    # arrival order (a fold waits for the one before it, and while one runs every later fold of
    # this state goes the same way). The state's wake-ups are held until then, so no output is
    # built from it half-folded. The hold starts here, before the manager marks the state.
    state.group.hold(state.index)
    state.folding = asyncio.get_running_loop().create_task(_fold_later(state, build, offload, state.folding))


def _entries(out: BatchStrOut, i: int, top_k: int) -> int:
    """About how many logprob entries (each a text to decode) entry `i` brings."""
    positions = len(out.input_logprobs[i] or ()) + len(out.output_logprobs[i] or ())
    return positions * (1 + top_k)


def _logprob_parts(out: BatchStrOut, i: int, texts: TokenTexts, tops: bool) -> LogprobParts:
    """Entry `i`'s logprob lists. Reads only the message, so it may run on a worker thread."""
    parts = LogprobParts()
    input_lps, output_lps = out.input_logprobs[i], out.output_logprobs[i]
    if input_lps is not None:
        ids = out.input_ids_for_logprobs[i] or []
        parts.input_tokens = token_logprobs(input_lps, ids, texts(ids))
        in_tops = out.input_top_logprobs[i]
        if in_tops is not None and tops:
            parts.input_tops = top_logprobs(in_tops, texts)
    if output_lps is not None:
        ids = out.output_ids[i]
        parts.output_tokens = token_logprobs(output_lps, ids, texts(ids))
    out_tops = out.output_top_logprobs[i]
    if out_tops is not None and tops:
        parts.output_tops = top_logprobs(out_tops, texts)
    return parts


def _assign(state: ReqState, parts: LogprobParts) -> None:
    """Input logprobs arrive once (they replace); output ones accumulate."""
    if parts.input_tokens is not None:
        state.input_token_logprobs = parts.input_tokens
    if parts.input_tops is not None:
        state.input_top_logprobs = parts.input_tops
    if parts.output_tokens is not None:
        state.output_token_logprobs.extend(parts.output_tokens)
    if parts.output_tops is not None and state.output_top_logprobs is not None:
        state.output_top_logprobs.extend(parts.output_tops)


async def _fold_later(state: ReqState, build: Callable[[], LogprobParts], offload: Offload,
                      before: asyncio.Task[None] | None) -> None:
    """Build the parts off the loop, assign them after the fold `before` (if any), release the
    hold `_apply_logprobs` took. A failed build fails the request, never silently."""
    try:
        parts = await offload(build)
        if before is not None:
            await asyncio.wait([before])  # its own failure is reported by itself
        _assign(state, parts)
    except Exception as exc:
        logger.exception("building the logprobs of request %s failed", state.rid)
        state.error = state.error or f"building the logprobs failed: {exc!r}"
        state.group.mark(state.index)
    finally:
        if state.folding is asyncio.current_task():
            state.folding = None
        state.group.release(state.index)


def _no_texts(ids: list[int]) -> list[str | None]:
    return [None] * len(ids)


@dataclass(slots=True)
class Cursor:
    """How much of each growing list of a state its consumer has taken."""

    pieces: int = 0
    ids: int = 0
    logprobs: int = 0
    tops: int = 0
    input: bool = False


@dataclass(frozen=True, slots=True)
class StateDelta:
    """What a state gained since its consumer's last take: new text, ids and logprob entries,
    the input logprobs once, and its counts and finish (None while it runs)."""

    text: str
    ids: list[int]
    logprobs: list[LogprobEntry] | None
    tops: list[list[LogprobEntry] | None] | None
    input: tuple[list[LogprobEntry], list[list[LogprobEntry] | None] | None] | None
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    finish_reason: dict[str, Any] | None
    label: str
    latency: float
    pinned_tokens: int = 0
    embedding: list[float] | None = None  # once, with the finish of an embed request


def take_delta(state: ReqState) -> StateDelta:
    """The state's news since the last take (cost: the news alone)."""
    c = state.taken
    text = "".join(state.pieces[c.pieces:])
    ids = state.output_ids[c.ids:]
    c.pieces, c.ids = len(state.pieces), len(state.output_ids)
    logprobs = tops = inputs = None
    if state.req.return_logprob:
        logprobs = state.output_token_logprobs[c.logprobs:]
        c.logprobs = len(state.output_token_logprobs)
        if state.output_top_logprobs is not None:
            tops = state.output_top_logprobs[c.tops:]
            c.tops = len(state.output_top_logprobs)
        if not c.input and state.input_token_logprobs:
            inputs, c.input = (state.input_token_logprobs, state.input_top_logprobs), True
    end = state.finished_time if state.finished_time is not None else time.perf_counter()
    return StateDelta(text, ids, logprobs, tops, inputs, state.prompt_tokens, state.completion_tokens,
                      state.cached_tokens, state.finish_reason if state.finished else None, state.label,
                      end - state.created, state.pinned_tokens, state.embedding if state.finished else None)
