"""The live-request index: an abort's requests without scanning the queues."""

from __future__ import annotations

from dataclasses import dataclass

from runtime.contracts.messages import AbortReq
from scheduler.rid_index import RidIndex, parents_of


@dataclass(eq=False)
class R:
    rid: str


def test_parents_are_the_rids_whose_abort_reaches_it() -> None:
    assert list(parents_of("a_3_1")) == ["a", "a_3"]
    assert list(parents_of("a_warmup")) == ["a"]
    assert list(parents_of("a_bar")) == [] and list(parents_of("_1")) == [] and list(parents_of("a")) == []


def test_matching_agrees_with_the_message_rule() -> None:
    index: RidIndex[R] = RidIndex()
    reqs = [R(r) for r in ("p", "p_0", "p_1", "p_1_0", "p_warmup", "p_bar", "p10", "q", "q_2")]
    for r in reqs:
        index.add(r)
    for msg in (AbortReq("p"), AbortReq("p_1"), AbortReq("q"), AbortReq("zzz"), AbortReq(""), AbortReq(abort_all=True)):
        got = {r.rid for r in index.matching(msg)}
        assert got == {r.rid for r in reqs if msg.matches(r.rid)}, msg
    index.check_integrity()
    for r in reqs:
        index.remove(r)
    assert len(index) == 0 and index.matching(AbortReq("p")) == []
    index.check_integrity()
    index.remove(reqs[0])  # twice: a no-op


def test_a_reused_rid_is_not_removed_by_its_predecessor() -> None:
    index: RidIndex[R] = RidIndex()
    old, new = R("x"), R("x")
    index.add(old)
    index.add(new)
    index.remove(old)
    assert index.matching(AbortReq("x")) == [new]
