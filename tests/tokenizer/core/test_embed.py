"""The embedding core against a stand-in manager: vectors finished by the pooling, in input
order, and an input that ends without a vector (aborted) is a timeout, not a crash."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import Any

import pytest

from runtime.contracts.errors import InvalidRequest
from tokenizer.core.embed import EmbedJob, embed_inputs
from tokenizer.core.request import GenRequest


class FakeManager:
    """Answers each prompt (in reverse order) with `vectors[i]`, or an abort where it is None."""

    def __init__(self, vectors: list[list[float] | None], normalize: bool = True) -> None:
        self.vectors = vectors
        self.scheduler_info = {"hidden_size": 2, "pooling": {"mode": "last", "normalize": normalize}}
        self.config = SimpleNamespace(max_prompts_per_request=4)
        self.sent: GenRequest | None = None

    async def submit(self, req: GenRequest) -> AsyncIterator[tuple[int, Any]]:
        self.sent = req
        return self._answers()

    async def _answers(self) -> AsyncIterator[tuple[int, Any]]:
        for i in reversed(range(len(self.vectors))):
            vec = self.vectors[i]
            reason = {"type": "length", "length": 0} if vec else {"type": "abort", "message": "deadline"}
            yield i, SimpleNamespace(embedding=vec, finish_reason=reason, prompt_tokens=3, cached_tokens=1)


def _job(n: int, dimensions: int | None = None) -> EmbedJob:
    return EmbedJob(["t"] * n, [f"input[{i}]" for i in range(n)], "input", rid="e", dimensions=dimensions)


def test_vectors_come_back_in_input_order_normalized() -> None:
    tm = FakeManager([[3.0, 4.0], [0.0, 2.0]])
    out = asyncio.run(embed_inputs(tm, _job(2)))  # type: ignore[arg-type]
    assert [e.vector for e in out] == [pytest.approx([0.6, 0.8]), pytest.approx([0.0, 1.0])]
    assert tm.sent is not None and tm.sent.embed and all(p.sampling == {"max_new_tokens": 0} for p in tm.sent.prompts)


def test_an_aborted_input_is_a_timeout_naming_it() -> None:
    with pytest.raises(TimeoutError, match=r"input\[1\] was not embedded: deadline"):
        asyncio.run(embed_inputs(FakeManager([[1.0, 0.0], None]), _job(2)))  # type: ignore[arg-type]


@pytest.mark.parametrize("n,dimensions,param", [(5, None, "input"), (1, 3, "dimensions"), (1, 0, "dimensions")])
def test_counts_and_dimensions_are_checked_before_sending(n: int, dimensions: int | None, param: str) -> None:
    tm = FakeManager([[1.0, 0.0]] * n)
    with pytest.raises(InvalidRequest) as err:
        asyncio.run(embed_inputs(tm, _job(n, dimensions)))  # type: ignore[arg-type]
    assert err.value.param == param and tm.sent is None
