"""When a request stops: length, stop tokens, stop strings (SGLang's `check_finished` order)."""

from __future__ import annotations

from collections.abc import Callable

from runtime.contracts.stop import find_stop, max_stop_len
from scheduler.request import Req

# A character can take up to 4 byte-level tokens, so this many tokens always cover a stop string.
TOKENS_PER_CHAR = 4


def check_finished(req: Req, decode: Callable[[list[int], bool], str]) -> None:
    """Finish `req` if its newest output token ends it.

    `decode(ids, skip_special_tokens)` turns ids into text; only the tail of the output is decoded,
    so the cost per step is bounded by the longest stop string, not the output length.
    """
    if req.finished:
        return
    sp = req.sampling
    token = req.output[-1]
    if len(req.output) >= sp.max_new_tokens:
        req.finish({"type": "length", "length": sp.max_new_tokens})
    elif token in req.stop_ids and len(req.output) >= sp.min_new_tokens:
        req.matched_stop_token = True
        req.finish({"type": "stop", "matched": token})
    elif sp.stop_strs and len(req.output) >= sp.min_new_tokens:
        window = TOKENS_PER_CHAR * max_stop_len(sp.stop_strs) + 2
        match = find_stop(decode(req.output[-window:], sp.skip_special_tokens), sp.stop_strs)
        if match is not None:
            req.finish({"type": "stop", "matched": match.stop})
