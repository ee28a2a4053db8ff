"""The field-spec machinery: bounds before items, one error per list, paths in the body."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from runtime.contracts.errors import InvalidRequest
from tokenizer.anthropic.spec import MessagesBody
from tokenizer.core.spec import DOTS, parse
from tokenizer.native.spec import DetokenizeBody, GenerateBody


@pytest.mark.parametrize("body", [
    {"input_ids": [["x"] * 1000] * 1000},  # a million bad ids
    {"input_ids": [[1] * 999 + ["x"]] * 1000},
])
def test_a_list_stops_at_its_first_bad_item(body: dict) -> None:
    """Each list member of a union stops at its first bad item, so a body of a million bad
    values makes a handful of errors, not a million (which took seconds of the event loop)."""
    with pytest.raises(ValidationError) as info:
        GenerateBody.model_validate(body)
    assert info.value.error_count() < 10
    with pytest.raises(InvalidRequest) as named:
        parse(GenerateBody, body)
    assert named.value.param is not None and named.value.param.startswith("input_ids[0]")


def test_a_length_bound_is_checked_before_the_items() -> None:
    with pytest.raises(InvalidRequest) as info:
        parse(DetokenizeBody, {"tokens": ["x"] * 200_000})
    assert info.value.param == "tokens" and "0 to 131072 items" in info.value.message


def test_a_tag_that_is_also_a_key_does_not_misname_the_field() -> None:
    """A text block's tag is `text`, also one of its keys: the bad field is its cache_control."""
    deep: object = 1
    for _ in range(10):
        deep = [deep]
    body = {"model": "m", "max_tokens": 1,
            "messages": [{"role": "user", "content": [{"type": "text", "text": "x", "cache_control": deep}]}]}
    with pytest.raises(InvalidRequest) as info:
        parse(MessagesBody, body, DOTS)
    assert info.value.param == "messages.0.content.0.cache_control"
