"""Stop-string matching shared by the scheduler (to finish) and the detokenizer (to trim).

Both sides call the same two functions on the same output text, so they agree on which
stop string matched and where.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple


class StopMatch(NamedTuple):
    """The first stop-string occurrence in a text."""

    pos: int
    """Index of the first character of the stop string."""
    stop: str
    """The stop string that matched."""


def find_stop(text: str, stops: Sequence[str]) -> StopMatch | None:
    """Return the earliest occurrence of any stop string in `text`, or None.

    Ties at the same position go to the longest stop string, so that with `no_stop_trim`
    the kept text includes the whole of what matched. Empty stop strings are ignored.
    """
    best: StopMatch | None = None
    for stop in stops:
        if not stop:
            continue
        end = len(text) if best is None else min(len(text), best.pos + len(stop))
        pos = text.find(stop, 0, end)
        if pos < 0:
            continue
        if best is None or pos < best.pos or (pos == best.pos and len(stop) > len(best.stop)):
            best = StopMatch(pos, stop)
    return best


def partial_stop_suffix_len(text: str, stops: Sequence[str]) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of some stop string.

    That suffix may still grow into a stop string, so a streamer must hold it back.
    Returns 0 when no suffix can start a stop string.
    """
    best = 0
    for stop in stops:
        # NOTE: only suffixes longer than the current best can improve it.
        for k in range(min(len(stop) - 1, len(text)), best, -1):
            if text.endswith(stop[:k]):
                best = k
                break
    return best


def max_stop_len(stops: Sequence[str]) -> int:
    """Length of the longest stop string (0 when there are none)."""
    return max((len(s) for s in stops), default=0)
