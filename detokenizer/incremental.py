"""Per-request incremental detokenization: SGLang's surround/read-offset algorithm.

Each request keeps only a small window of ids; everything before it is already text:

    _ids:  [ surround ids (text committed) | unread ids (text provisional) ]
           0                               _read                  len(_ids)

    window text = decode(_ids)[len(decode(_ids[:_read])):]

The surround gives the tokenizer its left context (SentencePiece leading spaces, merges), so
each step decodes O(window) ids, never the whole output. When the window text does not end
in U+FFFD (an unfinished UTF-8 sequence) it is committed: the unread ids become the next
surround. Otherwise the text before the trailing U+FFFD run is stable (UTF-8 is
self-synchronising) and may already be emitted; `_win_sent` counts how much of it was.

Text is emitted append-only. Text that could still grow into a stop string is held back in
`_unsent`; at most `max(len(stop)) - 1` characters of it. Whether a stop string ended the
request is decided once, by the scheduler (`scheduler/finish.py`), which sends the final ids
with the stop it matched; the text is cut there. It cannot start before the emitted point: the
scheduler stops at the first token that completes a stop string, and every emission holds back
the longest suffix that is a proper prefix of some stop string.

This module is pure: no torch, no zmq, no transformers.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol, cast

from runtime.contracts.stop import partial_stop_suffix_len

SURROUND_TOKENS = 5
"""Prompt tokens kept as left context for the first output tokens (SGLang's value)."""
REPLACEMENT_CHAR = "\ufffd"


class Tokenizer(Protocol):
    """What the detokenizer needs from a Hugging Face tokenizer (`batch_decode` is optional)."""

    def decode(
        self,
        token_ids: list[int],
        skip_special_tokens: bool = ...,
        spaces_between_special_tokens: bool = ...,
    ) -> str: ...


@dataclass(frozen=True, slots=True)
class DecodeOptions:
    """Per-request decoding options, taken from the request's sampling params."""

    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    stop: tuple[str, ...] = ()
    no_stop_trim: bool = False


class DecodeState:
    """Incremental decoder for one request; `feed` returns the new text to emit.

    Guarantees, for any split of the output ids into `feed` calls: the deltas concatenate
    to the decode of all output ids (cut at the first stop string, see below); no delta
    ends in a U+FFFD from an incomplete UTF-8 sequence (it is released once the bytes
    complete, or at the final feed); no text that is later cut is ever emitted.

    Stop strings: the final feed names the stop the scheduler matched (`matched_stop`); the
    text ends before it, or after it when `no_stop_trim`. A partial stop prefix held back is
    released at a finish that matched no stop string.
    """

    def __init__(
        self,
        tokenizer: Tokenizer,
        prompt_tail: Sequence[int] = (),
        options: DecodeOptions | None = None,
    ) -> None:
        """Create the state of one request, before its first output id.

        Args:
            prompt_tail: the last prompt ids (only the last `SURROUND_TOKENS` are kept),
                used as left context. Dropped when it ends inside a UTF-8 sequence, so
                the output still decodes exactly as `decode(output_ids)`.
        """
        self.tokenizer = tokenizer
        self.options = options or DecodeOptions()
        surround = list(prompt_tail[max(0, len(prompt_tail) - SURROUND_TOKENS) :])
        if surround and self._decode(surround).endswith(REPLACEMENT_CHAR):
            surround = []
        self._ids: list[int] = surround
        self._read = len(surround)
        self._unsent = ""  # committed text not yet emitted (a held-back stop prefix)
        self._win_sent = 0  # chars of the provisional window text already emitted
        self.emitted_len = 0
        """Total characters emitted so far (the length of the cumulative text)."""
        self.matched_stop: str | None = None
        self.finished = False

    def feed(
        self, new_ids: Sequence[int], finished: bool = False, *, trim_last_token: bool = False,
        matched_stop: str | None = None,
    ) -> str:
        """Add output ids and return the new text to emit (possibly "").

        Args:
            new_ids: the output ids generated since the last feed.
            finished: this is the final feed; everything held back is released.
            trim_last_token: the request finished on a stop token (EOS, stop_token_ids);
                the last id of `new_ids` is that token and is not decoded. Equivalent to
                the caller leaving it out.
            matched_stop: with `finished`, the stop string the scheduler found at the output's
                end (one of the request's stops); the text is cut at it.
        Raises:
            ValueError: a feed after the final one, or `trim_last_token` without a final
                feed that carries the token.
        """
        if not self._accept(new_ids, finished, trim_last_token, matched_stop):
            return ""
        surr_ids, all_ids = self._decode_inputs()
        return self._advance(self._decode(surr_ids), self._decode(all_ids))

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(
            ids,
            skip_special_tokens=self.options.skip_special_tokens,
            spaces_between_special_tokens=self.options.spaces_between_special_tokens,
        )

    def _accept(self, new_ids: Sequence[int], finished: bool, trim_last_token: bool,
                matched_stop: str | None = None) -> bool:
        """Record the ids and the scheduler's verdict; return whether a decode step is needed."""
        if self.finished:
            raise ValueError("feed after the final feed")
        if matched_stop is not None:
            if not finished or matched_stop not in self.options.stop:
                raise ValueError("matched_stop names one of the request's stops, on its final feed")
            self.matched_stop = matched_stop
        ids = list(new_ids)
        if trim_last_token:
            if not finished or not ids:
                raise ValueError("trim_last_token needs a final feed that carries the stop token")
            ids.pop()
        self.finished = finished
        self._ids.extend(ids)
        return bool(ids) or finished

    def _decode_inputs(self) -> tuple[list[int], list[int]]:
        """The two id lists to decode: the surround alone, and surround + unread."""
        return self._ids[: self._read], self._ids

    def _advance(self, surr_text: str, full_text: str) -> str:
        """Turn the two decodes into the delta and move the offsets."""
        window = full_text[len(surr_text) :]
        commit = not self.finished and window != "" and not window.endswith(REPLACEMENT_CHAR)
        printable = window if self.finished else window.rstrip(REPLACEMENT_CHAR)
        unsent = self._unsent + printable[self._win_sent :]
        delta = self._emittable(unsent)
        self.emitted_len += len(delta)
        if self.finished:
            self._ids, self._read, self._unsent = [], 0, ""
        elif commit:
            self._ids = self._ids[self._read :]
            self._read = len(self._ids)
            self._unsent, self._win_sent = unsent[len(delta) :], 0
        elif len(delta) <= len(self._unsent):
            self._unsent = self._unsent[len(delta) :]
        else:
            self._win_sent += len(delta) - len(self._unsent)
            self._unsent = ""
        return delta

    def _emittable(self, unsent: str) -> str:
        """The prefix of `unsent` that is safe to emit now: all of it once finished (cut at the
        scheduler's stop), else all but a possible start of a stop string."""
        stops = self.options.stop
        if self.matched_stop is not None:
            at = unsent.find(self.matched_stop)
            if at >= 0:
                return unsent[: at + (len(self.matched_stop) if self.options.no_stop_trim else 0)]
        if self.finished or not stops:
            return unsent
        return unsent[: len(unsent) - partial_stop_suffix_len(unsent, stops)]


class DecodeStateTable:
    """rid -> DecodeState for the detokenizer process, bounded and cleaned on finish.

    At capacity the least recently fed state is evicted (SGLang's LimitedCapacityDict);
    `evictions` counts them, as a live request evicted loses its held-back context.
    """

    def __init__(self, tokenizer: Tokenizer, capacity: int = 65536) -> None:
        assert capacity > 0, f"capacity must be positive, got {capacity}"
        self.tokenizer = tokenizer
        self.capacity = capacity
        self.evictions = 0
        self._states: OrderedDict[str, DecodeState] = OrderedDict()

    def __len__(self) -> int:
        return len(self._states)

    def __contains__(self, rid: object) -> bool:
        return rid in self._states

    def get(self, rid: str) -> DecodeState | None:
        return self._states.get(rid)

    def open(
        self, rid: str, prompt_tail: Sequence[int] = (), options: DecodeOptions | None = None
    ) -> DecodeState:
        """Create (or replace) the state of `rid`, evicting the oldest one at capacity."""
        self._states.pop(rid, None)
        while len(self._states) >= self.capacity:
            self._states.popitem(last=False)
            self.evictions += 1
        state = DecodeState(self.tokenizer, prompt_tail, options)
        self._states[rid] = state
        return state

    def discard(self, rid: str) -> None:
        """Forget `rid` (abort); unknown rids are ignored."""
        self._states.pop(rid, None)

    def feed_batch(
        self,
        rids: Sequence[str],
        new_ids: Sequence[Sequence[int]],
        finished: Sequence[bool],
        *,
        trim_last_token: Sequence[bool] | None = None,
        prompt_tails: Sequence[Sequence[int] | None] | None = None,
        options: Sequence[DecodeOptions | None] | None = None,
        matched_stops: Sequence[str | None] | None = None,
    ) -> list[str]:
        """Feed one batch message (parallel lists); return the delta of each request.

        A rid not in the table is opened from `prompt_tails[i]` and `options[i]` (both
        ignored for known rids, so a sender may fill them on the first message only).
        Finished requests are removed. The decodes of the whole batch go through one
        `batch_decode` call per option group when the tokenizer has it.
        """
        n = len(rids)
        assert len(new_ids) == n and len(finished) == n, "parallel lists differ in length"
        deltas = [""] * n
        groups: dict[tuple[bool, bool], list[tuple[int, DecodeState]]] = {}
        for i, rid in enumerate(rids):
            state = self._states.get(rid)
            if state is None:
                tail = prompt_tails[i] if prompt_tails is not None else None
                opts = options[i] if options is not None else None
                state = self.open(rid, tail or (), opts)
            else:
                self._states.move_to_end(rid)
            trim = trim_last_token[i] if trim_last_token is not None else False
            matched = matched_stops[i] if matched_stops is not None else None
            if state._accept(new_ids[i], finished[i], trim, matched):
                opts = state.options
                key = (opts.skip_special_tokens, opts.spaces_between_special_tokens)
                groups.setdefault(key, []).append((i, state))
        for (skip, spaces), members in groups.items():
            texts = self._decode_many(
                [seq for _, state in members for seq in state._decode_inputs()], skip, spaces
            )
            for j, (i, state) in enumerate(members):
                deltas[i] = state._advance(texts[2 * j], texts[2 * j + 1])
        for i, rid in enumerate(rids):
            if finished[i]:
                self._states.pop(rid, None)
        return deltas

    def _decode_many(self, seqs: list[list[int]], skip: bool, spaces: bool) -> list[str]:
        # batch_decode is not part of the protocol (some tokenizers lack it); getattr gives Any.
        batch_decode = cast("Callable[..., list[str]] | None", getattr(self.tokenizer, "batch_decode", None))
        if batch_decode is not None:
            return batch_decode(
                seqs, skip_special_tokens=skip, spaces_between_special_tokens=spaces
            )
        return [
            self.tokenizer.decode(s, skip_special_tokens=skip, spaces_between_special_tokens=spaces)
            for s in seqs
        ]
