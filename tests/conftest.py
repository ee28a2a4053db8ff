"""Shared pytest setup: the `gpu` and `slow` markers and the default model fixture.

- `@pytest.mark.gpu` tests are skipped when CUDA is absent. torch is imported only when such a
  test was collected, so the pure-Python suites (radix, detokenizer) stay fast.
- `@pytest.mark.slow` tests run by default; deselect them with `-m "not slow"`.
- `default_model_path` is the embedded SmolLM2-135M-Instruct folder, converted once per machine.
- `shared_server` is one real HTTP server on the default model with the test defaults
  (`tests/tokenizer/http_helpers.BASE_ARGS`, no other flags), started once for the whole run:
  every test that needs no flag of its own uses it, rather than paying a start per module.
  Tests that use it leave it as they found it: healthy, idle, with its default settings.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    gpu_items = [item for item in items if item.get_closest_marker("gpu") is not None]
    if not gpu_items or _cuda_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in gpu_items:
        item.add_marker(skip)


@pytest.fixture(scope="session")
def default_model_path() -> str:
    """Path of the default model's Hugging Face folder (converted on first use, ~30 s)."""
    from runtime.default_model import ensure_default_model

    return ensure_default_model()


@pytest.fixture(scope="session")
def shared_server(default_model_path: str) -> Iterator[Any]:
    """The run's one default server (a `tests.tokenizer.http_helpers.RunningServer`)."""
    from tests.tokenizer.http_helpers import RunningServer

    with RunningServer.start(default_model_path) as server:
        yield server
