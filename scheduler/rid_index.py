"""Live requests by rid, with each one's own fan-out, so an abort finds its requests in O(k)
(k: the requests it names) instead of testing every request in every queue.

A rid `P_S` is a child of `P` when S is a suffix `AbortReq.matches` accepts (digit groups, or the
n>1 warm-up's `warmup`): `rid_3`, `rid_3_1` and `rid_warmup` are children of `rid`, and `rid_3_1`
of `rid_3` too. Pure Python; the scheduler adds a request on arrival and removes it once its end
is reported.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Generic, Protocol, TypeVar

from runtime.contracts.messages import CHILD_SUFFIX, AbortReq


class HasRid(Protocol):
    rid: str


R = TypeVar("R", bound=HasRid)


def parents_of(rid: str) -> Iterator[str]:
    """Every rid whose abort also aborts `rid` (apart from `rid` itself)."""
    for i, ch in enumerate(rid):
        if ch == "_" and i > 0 and CHILD_SUFFIX.fullmatch(rid[i + 1 :]):
            yield rid[:i]


class RidIndex(Generic[R]):
    def __init__(self) -> None:
        self.by_rid: dict[str, R] = {}
        self._children: dict[str, set[str]] = {}

    def __len__(self) -> int:
        return len(self.by_rid)

    def add(self, req: R) -> None:
        self.by_rid[req.rid] = req
        for parent in parents_of(req.rid):
            self._children.setdefault(parent, set()).add(req.rid)

    def remove(self, req: R) -> None:
        if self.by_rid.get(req.rid) is not req:
            return
        del self.by_rid[req.rid]
        for parent in parents_of(req.rid):
            family = self._children.get(parent)
            if family is not None:
                family.discard(req.rid)
                if not family:
                    del self._children[parent]

    def matching(self, msg: AbortReq) -> list[R]:
        """The live requests `msg` aborts (what `msg.matches` would pick, without a scan)."""
        if msg.abort_all:
            return list(self.by_rid.values())
        if not msg.rid:
            return []
        rids = [msg.rid, *sorted(self._children.get(msg.rid, ()))]
        return [self.by_rid[r] for r in rids if r in self.by_rid]

    def check_integrity(self) -> None:
        for parent, family in self._children.items():
            assert family, f"empty family of {parent!r}"
            for rid in family:
                assert rid in self.by_rid and parent in parents_of(rid), (parent, rid)
