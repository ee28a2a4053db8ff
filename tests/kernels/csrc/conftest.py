"""The built C++ kernels (kernels/csrc/) for every test here: a failure, not a skip, without them."""

from __future__ import annotations

from types import ModuleType

import pytest

from runtime.execution.cpu_kernels import load_cpu_kernels


@pytest.fixture(scope="session")
def kernels() -> ModuleType:
    module = load_cpu_kernels()
    assert module is not None, "the C++ CPU kernels are not built: run `python -m runtime.execution.cpu_kernels build`"
    return module

