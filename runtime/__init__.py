"""radixserve's runtime: config, messages, IPC, launch, the in-process Engine, the model runner.

`from runtime import Engine` imports the Engine lazily (module `__getattr__`), so `import runtime`
stays cheap and torch-free for the processes and tools that only need messages or the config.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from runtime.engine import Engine

__all__ = ["Engine"]


def __getattr__(name: str) -> Any:
    if name == "Engine":
        from runtime.engine import Engine

        return Engine
    raise AttributeError(f"module 'runtime' has no attribute {name!r}")
