"""Fixtures shared by the runtime tests: the default model's tokenizer, the shared chat prompts
and Hugging Face's greedy answers to them, each computed once per run (see chat_reference)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.runtime import chat_reference


@pytest.fixture(scope="session")
def default_tokenizer(default_model_path: str) -> Any:
    """The default model's HF tokenizer (read-only use: tests must not change its settings)."""
    import transformers

    return transformers.AutoTokenizer.from_pretrained(default_model_path)


@pytest.fixture(scope="session")
def chat_ids(default_tokenizer: Any) -> list[list[int]]:
    """`chat_reference.QUESTIONS` as chat-template token ids. Tests must not mutate the lists."""
    return chat_reference.chat_ids(default_tokenizer)


@pytest.fixture(scope="session")
def hf_greedy(default_model_path: str, chat_ids: list[list[int]]) -> chat_reference.HFGreedy:
    """HF's fp32 greedy answers to `chat_ids` (`.first(n)`), each computed once per run. The HF
    model stays loaded (about 0.5 GB) until every answer is known, so a later module's prompts
    cost no second load."""
    return chat_reference.HFGreedy(default_model_path, chat_ids)
