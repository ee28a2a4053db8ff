"""Admission control and prompt encoding, before anything of a request is queued.

`check_admission` refuses what the server cannot hold: a 503 (`Overloaded`, with Retry-After)
when it is full now, a 400 naming the field when the request could never be held at once.
`PromptEncoder` encodes long prompt texts and decodes long id lists (/detokenize, a completion's
`echo`, logprob texts) on one worker thread, so the event loop keeps serving every other stream
meanwhile (an 8 MiB body of text held it for seconds). Short ones run inline: the thread hop
would cost more than the work.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from runtime.contracts.errors import InvalidRequest, Overloaded
from tokenizer.generate_body import SingleRequest

OFFLOAD_TOKENIZE_CHARS = 4096  # prompt text from which encoding leaves the event loop
# Token ids (or logprob entries) from which decoding leaves the event loop: per-token texts cost
# about 15 us an id, so 512 of them hold the loop for under 10 ms.
OFFLOAD_DECODE_IDS = 512
T = TypeVar("T")


def check_admission(held: int, count: int, max_held: int, field: str) -> None:
    """Admit `count` more requests beside `held` ones, at most `max_held` in all."""
    if count > max_held:
        raise InvalidRequest(f"this request needs {count} request slots and the server holds at most "
                             f"{max_held} (--max-running-requests + --max-queued-requests)", param=field)
    if held + count > max_held:
        raise Overloaded(f"The server is at capacity ({held} requests in flight, at most {max_held}); retry later.")


class PromptEncoder:
    """Encodes prompts and decodes ids, on its one worker thread ("tokenize-*") when long."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tokenize")

    async def encode(self, requests: list[SingleRequest]) -> list[list[int]]:
        """Each request's prompt ids (given ids as they are)."""
        it = iter(await self.encode_texts([r.text or "" for r in requests if r.input_ids is None]))
        return [list(r.input_ids) if r.input_ids is not None else next(it) for r in requests]

    async def encode_texts(self, texts: list[str], add_special_tokens: bool = True) -> list[list[int]]:
        """The ids of each text, as /generate encodes a prompt (and /tokenize counts it)."""

        def run() -> list[list[int]]:
            return [self.tokenizer.encode(t, add_special_tokens=add_special_tokens) for t in texts]

        if sum(len(t) for t in texts) < OFFLOAD_TOKENIZE_CHARS:
            return run()
        return await self.off_loop(run)

    async def decode(self, seqs: list[list[int]], skip_special_tokens: bool = False) -> list[str]:
        """The text of each id list, as `tokenizer.decode` gives it. The caller bounds the ids
        (each route documents its maximum) and checks they are in the vocabulary."""

        def run() -> list[str]:
            return [self.tokenizer.decode(s, skip_special_tokens=skip_special_tokens) for s in seqs]

        if sum(len(s) for s in seqs) < OFFLOAD_DECODE_IDS:
            return run()
        return await self.off_loop(run)

    async def off_loop(self, job: Callable[[], T]) -> T:
        """`job()` on the worker thread (queued behind any encode or decode already there)."""
        return await asyncio.get_running_loop().run_in_executor(self.pool, job)

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)
