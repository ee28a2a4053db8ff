"""What the installed environment must not hold for our packages to import as themselves."""

from __future__ import annotations

import importlib.metadata

import pytest


def test_no_other_distribution_provides_our_kernels_package() -> None:
    """Hugging Face's `kernels` distribution imports as `kernels`, our kernels/ package's name.
    transformers 5.25 requires it and, finding it installed, imports ours in its place and fails
    (pyproject.toml pins transformers below 5.25 for this)."""
    with pytest.raises(importlib.metadata.PackageNotFoundError):
        importlib.metadata.version("kernels")
    import transformers.activations  # imports transformers' hub kernels integration

    import kernels

    assert kernels.__file__ is not None and "site-packages" not in kernels.__file__
    assert transformers.activations.ACT2FN is not None
