"""Client rids as labels (tokenizer/labels.py, tokenizer/fanout.py): pure, milliseconds."""

from __future__ import annotations

import pytest

from runtime.contracts.messages import GenerateReq
from runtime.contracts.sampling import SamplingParams
from tokenizer.fanout import Prepared
from tokenizer.labels import InternalRids, LabelIndex
from tokenizer.native.generate import parse_generate


def _prepared(internal: str, label: str, n: int, group_rid: str | None = None) -> Prepared:
    return Prepared(GenerateReq(rid=internal, input_ids=[1], sampling_params=SamplingParams()), label, group_rid, n)


def test_internal_rids_are_fresh_and_never_a_clients() -> None:
    rids = InternalRids()
    made = [rids.next() for _ in range(100)]
    assert len(set(made)) == 100 and all(r.startswith("q") and "_" not in r for r in made)


def test_names_are_the_ones_the_server_gave() -> None:
    one = _prepared("q1", "v", 1)
    assert one.child_rids() == ["q1"] and one.child_labels() == ["v"] and one.names("v") == ("v",)
    fan = _prepared("q2", "r", 3)
    assert fan.all_rids() == ["q2_warmup", "q2_0", "q2_1", "q2_2"]
    assert fan.child_labels() == ["r_0", "r_1", "r_2"] and fan.names("r_1") == ("r_1", "r")
    batch = parse_generate({"text": ["a", "b"], "rid": "b"})
    assert [p.rid for p in batch.prompts] == ["b_0", "b_1"] and batch.group_rid == "b"
    assert _prepared("q3", batch.prompts[1].rid, 2, batch.group_rid).all_names() == ["b_1_0", "b_1", "b", "b_1_1"]
    listed = parse_generate({"text": ["a", "b"], "rid": ["x", "y"]})
    assert [p.rid for p in listed.prompts] == ["x", "y"] and listed.group_rid is None


def test_aborting_v_never_names_another_clients_v_3() -> None:
    index = LabelIndex()
    index.add("q1", ("v",))
    index.add("q2", ("v_3",))  # another client's own rid, not a child of "v"
    assert index.find("v") == ["q1"] and index.find("v_3") == ["q2"]
    fan = _prepared("q3", "w", 2)
    for rid, label in zip(fan.child_rids(), fan.child_labels()):
        index.add(rid, fan.names(label))
    assert index.find("w") == ["q3_0", "q3_1"] and index.find("w_1") == ["q3_1"]


def test_in_use_remove_and_integrity() -> None:
    index = LabelIndex()
    index.add("q1", ("a_0", "a"))
    index.add("q2", ("a_1", "a"))
    assert index.in_use(["z", "a"]) == "a" and index.in_use(["z"]) is None
    index.check_integrity({"q1": ("a_0", "a"), "q2": ("a_1", "a")})
    index.remove("q1", ("a_0", "a"))
    assert index.find("a") == ["q2"] and index.in_use(["a_0"]) is None
    with pytest.raises(AssertionError, match="out of sync"):
        index.check_integrity({})
    index.remove("q2", ("a_1", "a"))
    assert len(index) == 0
