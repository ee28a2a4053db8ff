"""radixserve's runtime: the contracts every process shares and the model execution.

Sub-packages, bottom to top (docs/architecture.md has the picture and what each may import):
`contracts/` (config, messages, codec, IPC, errors, sampling parameters, stop rules; no torch),
`support/` (process, tokenizer and default-model helpers; no torch), `parallel/` (tensor-parallel
groups and layers), `models/`, `execution/` (the model runner and what loads and feeds it).

`from runtime import Engine` is the one name re-exported from above: the Engine lives with the
launcher in `tokenizer/` (the main process starts the others) and is imported lazily here (module
`__getattr__`), so `import runtime` stays cheap and torch-free and no import cycle forms.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tokenizer.engine import Engine

__all__ = ["Engine"]


def __getattr__(name: str) -> Any:
    if name == "Engine":
        from tokenizer.engine import Engine

        return Engine
    raise AttributeError(f"module 'runtime' has no attribute {name!r}")
