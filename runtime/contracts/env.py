"""The one module that reads environment variables. Every variable has the prefix `RADIXSERVE_`.

Each value is read by a function at the moment it is needed, never into a module global at import
time, so tests can set a variable with `monkeypatch.setenv` and see it take effect.

| variable                | type | default               | meaning                                  |
|-------------------------|------|-----------------------|------------------------------------------|
| `RADIXSERVE_CACHE_DIR`  | path | `~/.cache/radixserve` | where converted models and caches live   |
| `RADIXSERVE_CPU_CAPABILITY` | `auto`, `avx2`, `avx512`, `avx512_bf16`, `amx` | `auto` | overrides what |
|                         |      |                       | `runtime.execution.device` reads of the  |
|                         |      |                       | CPU (dtype and prepacking choices)       |
| `RADIXSERVE_CPU_KERNELS` | bool | `1` | use our C++ CPU kernels when built (0: torch ops only) |
| `RADIXSERVE_CPU_KERNELS_MARCH` | `native`, `x86-64-v3` | `native` | the build of the C++ kernels |
|                         |      |                       | to load (x86-64-v3: AVX2 only, for the   |
|                         |      |                       | AVX2 emulation run)                      |
| `RADIXSERVE_TP_SHM`     | bool | `1` | CPU tensor parallelism: collectives through shared memory (0: gloo only) |
| `RADIXSERVE_API_KEY`    | str  | unset | the server's API key when neither `--api-key` nor `--api-key-file` is given |
"""

from __future__ import annotations

import os
from pathlib import Path

PREFIX = "RADIXSERVE_"

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


def _raw(name: str) -> str | None:
    """The raw value of `RADIXSERVE_<name>`, or None when unset."""
    return os.environ.get(PREFIX + name)


def get_str(name: str, default: str) -> str:
    value = _raw(name)
    return default if value is None else value


def get_int(name: str, default: int) -> int:
    value = _raw(name)
    if value is None or value.strip() == "":
        return default
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"{PREFIX}{name} must be an integer, got {value!r}") from None


def get_bool(name: str, default: bool) -> bool:
    value = _raw(name)
    if value is None:
        return default
    lowered = value.strip().lower()
    if lowered in _TRUE:
        return True
    if lowered in _FALSE:
        return False
    raise ValueError(f"{PREFIX}{name} must be one of 1/0/true/false/yes/no/on/off, got {value!r}")


def cache_dir() -> Path:
    """`RADIXSERVE_CACHE_DIR`: the root for converted models and other caches (not created here)."""
    value = _raw("CACHE_DIR")
    if value:
        return Path(value).expanduser().absolute()
    return Path.home() / ".cache" / "radixserve"


def api_key() -> str | None:
    """`RADIXSERVE_API_KEY` stripped of surrounding whitespace ("" when set but blank); None when unset."""
    value = _raw("API_KEY")
    return None if value is None else value.strip()
