"""Fixtures for the scheduler tests: a tiny random-weight Llama with the default tokenizer.

torch and transformers load inside the fixtures, so the fake-runner tests
(test_scheduler_parts.py) run without them."""

from __future__ import annotations

from collections.abc import Iterator

import pytest


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory, default_model_path: str) -> str:
    import torch
    import transformers

    from tests.scheduler.harness import VOCAB

    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=VOCAB, max_position_embeddings=512, eos_token_id=2,
    )
    path = tmp_path_factory.mktemp("tiny_llama")
    transformers.LlamaForCausalLM(cfg).save_pretrained(path)
    transformers.AutoTokenizer.from_pretrained(default_model_path).save_pretrained(path)
    return str(path)


@pytest.fixture(scope="module", autouse=True)
def _release_reused_loads() -> Iterator[None]:
    """`harness.make` reuses loaded models within a module; free them when the module is done."""
    yield
    import sys

    harness = sys.modules.get("tests.scheduler.harness")  # imported only by the real-model tests
    if harness is not None:
        harness.clear_load_caches()
