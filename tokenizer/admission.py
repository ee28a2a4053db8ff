"""Admission control and prompt encoding, before anything of a request is queued.

`check_admission` refuses what the server cannot hold: a 503 (`Overloaded`, with Retry-After)
when it is full now, a 400 naming the field when the request could never be held at once.

`PromptEncoder` encodes prompt texts and decodes id lists (/detokenize, a completion's `echo`,
logprob texts) off the event loop when they are long, in two lanes: work on inputs of up to
`SHORT_LANE_CHARS` runs on one thread, longer work on another, so one client's megabytes never
queue ahead of another client's short chat (the tokenizer releases the GIL while it encodes).
Short texts run inline: the thread hop would cost more than the work.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from runtime.contracts.errors import InvalidRequest, Overloaded

OFFLOAD_TOKENIZE_CHARS = 4096  # prompt text from which encoding leaves the event loop
SHORT_LANE_CHARS = 64 * 1024  # work on inputs up to this size takes the short lane
# Token ids (or logprob entries) from which decoding leaves the event loop: per-token texts cost
# about 15 us an id, so 512 of them hold the loop for under 10 ms.
OFFLOAD_DECODE_IDS = 512
T = TypeVar("T")
# Normalizers that never shrink a text (so a token still covers at most its own length of it).
_GROWING_NORMALIZERS = ("Prepend", "Replace")


def check_admission(held: int, count: int, max_held: int, field: str) -> None:
    """Admit `count` more requests beside `held` ones, at most `max_held` in all."""
    if count > max_held:
        raise InvalidRequest.field(field, f"this request needs {count} request slots and the server holds at most "
                                          f"{max_held} (--max-running-requests + --max-queued-requests)")
    if held + count > max_held:
        raise Overloaded(f"The server is at capacity ({held} requests in flight, at most {max_held}); retry later.")


def max_chars_per_token(tokenizer: Any) -> int | None:
    """The most characters of a prompt one token can cover: the longest token's text (a
    byte-level or metaspace token is at least as long as the text it covers), or None when the
    tokenizer's normalizer may shrink a text (then no character count proves anything)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        return None
    normalizer = json.loads(backend.to_str()).get("normalizer")
    steps = [] if normalizer is None else normalizer.get("normalizers", [normalizer])
    for step in steps:
        if step.get("type") not in _GROWING_NORMALIZERS:
            return None
        pattern = (step.get("pattern") or {}).get("String", "")
        if step.get("type") == "Replace" and len(step.get("content", "")) < len(pattern):
            return None
    return max(len(token) for token in tokenizer.get_vocab())


class PromptEncoder:
    """Encodes prompts and decodes ids, on a worker thread of the right lane when long."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.short = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tokenize-short")
        self.long = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tokenize-long")

    async def encode_texts(self, texts: list[str], add_special_tokens: bool = True) -> list[list[int]]:
        """The ids of each text, as /generate encodes a prompt (and /tokenize counts it)."""

        def run() -> list[list[int]]:
            return [self.tokenizer.encode(t, add_special_tokens=add_special_tokens) for t in texts]

        chars = sum(len(t) for t in texts)
        if chars < OFFLOAD_TOKENIZE_CHARS:
            return run()
        return await self.off_loop(run, chars)

    async def decode(self, seqs: list[list[int]], skip_special_tokens: bool = False) -> list[str]:
        """The text of each id list, as `tokenizer.decode` gives it. The caller bounds the ids
        (each route documents its maximum) and checks they are in the vocabulary."""

        def run() -> list[str]:
            return [self.tokenizer.decode(s, skip_special_tokens=skip_special_tokens) for s in seqs]

        ids = sum(len(s) for s in seqs)
        if ids < OFFLOAD_DECODE_IDS:
            return run()
        return await self.off_loop(run, ids * 4)

    async def off_loop(self, job: Callable[[], T], size: int = 0) -> T:
        """`job()` on the lane for work on `size` characters (queued behind that lane's work)."""
        pool = self.short if size <= SHORT_LANE_CHARS else self.long
        return await asyncio.get_running_loop().run_in_executor(pool, job)

    def close(self) -> None:
        for pool in (self.short, self.long):
            pool.shutdown(wait=False, cancel_futures=True)
