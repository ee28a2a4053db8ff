"""Client request ids (`rid`) as labels: what a client may name, never what our processes key on.

The main process gives every request it sends a fresh internal rid (`InternalRids`); the
scheduler and the detokenizer only ever see those, so no client can make two requests share a
key inside them (a reused rid, a rid equal to another request's fan-out child, a rid still being
aborted after its client left). The client's rid survives as labels: the id a result reports, and
the names `/abort_request` accepts. A state's names are exactly the ones the server gave it:

    rid "r", one prompt, n=1     -> result id "r";     aborted by "r"
    rid "r", n=3, sample j       -> result id "r_j";   aborted by "r_j" or "r"
    rid "b", a batch, prompt i   -> result id "b_i";   aborted by "b_i" or "b" (and "b_i_j" with n>1)

so aborting "v" never touches a request another client named "v_3". Pure: no sockets.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable


class InternalRids:
    """Fresh internal rids: "q1", "q2", ... (never a client's string; the scheduler's fan-out
    suffixes "_j" and "_warmup" are added to them, not to client rids)."""

    def __init__(self) -> None:
        self._counter = itertools.count(1)

    def next(self) -> str:
        return f"q{next(self._counter)}"


class LabelIndex:
    """Live internal rids by the client names that abort them."""

    def __init__(self) -> None:
        self._by_name: dict[str, dict[str, None]] = {}  # name -> ordered set of internal rids

    def __len__(self) -> int:
        return len(self._by_name)

    def in_use(self, names: Iterable[str]) -> str | None:
        """The first of `names` that a live request already answers to, or None."""
        return next((name for name in names if name in self._by_name), None)

    def add(self, rid: str, names: Iterable[str]) -> None:
        for name in names:
            self._by_name.setdefault(name, {})[rid] = None

    def remove(self, rid: str, names: Iterable[str]) -> None:
        for name in names:
            rids = self._by_name.get(name)
            if rids is not None:
                rids.pop(rid, None)
                if not rids:
                    del self._by_name[name]

    def find(self, name: str) -> list[str]:
        """The internal rids that `name` aborts."""
        return list(self._by_name.get(name, ()))

    def clear(self) -> None:
        self._by_name.clear()

    def check_integrity(self, live: dict[str, tuple[str, ...]]) -> None:
        """`live`: each live internal rid's names. Raises when the index disagrees with it."""
        want: dict[str, set[str]] = {}
        for rid, names in live.items():
            for name in names:
                want.setdefault(name, set()).add(rid)
        have = {name: set(rids) for name, rids in self._by_name.items()}
        assert have == want, f"label index out of sync: {have} != {want}"
