"""Admission control and prompt encoding, before anything of a request is queued.

`check_admission` refuses what the server cannot hold: a 503 (`Overloaded`, with Retry-After)
when it is full now, a 400 naming the field when the request could never be held at once.
`PromptEncoder` encodes long prompt texts on a worker thread, so the event loop keeps serving
every other stream meanwhile (an 8 MiB body of text held it for seconds).
"""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from runtime.errors import InvalidRequest, Overloaded
from tokenizer.generate_body import SingleRequest

OFFLOAD_TOKENIZE_CHARS = 4096  # prompt text from which encoding leaves the event loop


def check_admission(held: int, count: int, max_held: int, field: str) -> None:
    """Admit `count` more requests beside `held` ones, at most `max_held` in all."""
    if count > max_held:
        raise InvalidRequest(f"this request needs {count} request slots and the server holds at most "
                             f"{max_held} (--max-running-requests + --max-queued-requests)", param=field)
    if held + count > max_held:
        raise Overloaded(f"The server is at capacity ({held} requests in flight, at most {max_held}); retry later.")


class PromptEncoder:
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
        return await asyncio.get_running_loop().run_in_executor(self.pool, run)

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)
