"""Retraction under memory pressure and the `new_token_ratio` that sizes decode reservations.

Admission reserves only `new_token_ratio` of each running request's remaining output (SGLang's
optimistic estimate, since most requests stop well before max_new_tokens). When a decode step
then cannot get KV, the requests with the least progress are retracted back to the waiting
queue: their computed KV goes to the prefix cache (so re-admission usually hits it), their output
so far is kept, and the ratio rises to what the running set actually needs.
"""

from __future__ import annotations

from dataclasses import dataclass

from scheduler.request import Req

INIT_RATIO = 0.7
MIN_RATIO = INIT_RATIO * 0.14
DECAY_STEPS = 600  # decode steps for the ratio to decay from INIT to MIN
RETRACT_DECODE_STEPS = 20  # the decode steps a retraction should buy the remaining requests
CLIP_NEW_TOKENS = 4096  # cap on the remaining output counted for one request


@dataclass
class NewTokenRatio:
    value: float = INIT_RATIO

    def decay(self) -> None:
        self.value = max(self.value - (INIT_RATIO - MIN_RATIO) / DECAY_STEPS, MIN_RATIO)

    def reset(self) -> None:
        self.value = INIT_RATIO

    def after_retraction(self, running: list[Req]) -> None:
        decoded = sum(len(r.output) for r in running)
        budget = sum(r.sampling.max_new_tokens for r in running)
        self.value = min(1.0, (decoded + RETRACT_DECODE_STEPS * len(running)) / (budget + 1))


def pages(tokens: int, page_size: int) -> int:
    """`tokens` rounded up to whole pages, plus one page for a partly used last page."""
    return -(-max(tokens, 0) // page_size) * page_size + page_size


def admission_kv(req: Req, page_size: int) -> int:
    """KV a request asks for at admission: its uncomputed tokens and its whole (clipped) output."""
    remaining = min(req.remaining_new_tokens, CLIP_NEW_TOKENS)
    return pages(len(req.fill_ids) - req.computed + remaining, page_size)


def reserved_kv(req: Req, ratio: float, page_size: int) -> int:
    """KV a running request is expected to still take: ratio times its remaining output."""
    remaining = min(req.remaining_new_tokens, CLIP_NEW_TOKENS)
    return pages(len(req.fill_ids) - req.computed + int(remaining * ratio + 0.5), page_size)


def decode_slots_needed(running: list[Req], page_size: int) -> int:
    """Slots the next decode step takes: a new page for each request whose last page is full."""
    return sum(page_size for r in running if len(r.kv) % page_size == 0)


def pick_victim(running: list[Req]) -> Req:
    """The request to retract first: fewest output tokens, then the longest prompt."""
    return min(running, key=lambda r: (len(r.output), -len(r.prompt)))
