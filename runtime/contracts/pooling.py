"""How a model's hidden states become one embedding per input: the pooling and whether the vector
is L2-normalized, read from a sentence-transformers folder (`modules.json`, `1_Pooling/config.json`).

    pooling = read_pooling(model_path, is_encoder=False)   # Pooling(mode="last", normalize=True)
    vector = finish_embedding(raw, pooling, dimensions=256)

A folder without sentence-transformers files gets the default of its kind: decoders pool the last
prompt token's final hidden state (what the radix cache can serve: a cached prefix keeps its KV,
not its hidden states) and encoders the mean over the tokens; both are normalized. A `dimensions`
cut keeps the leading values and normalizes again, as Matryoshka models are trained to be read.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from typing import Any, Literal

PoolingMode = Literal["last", "mean", "cls"]
POOLING_MODULE = "sentence_transformers.models.Pooling"
NORMALIZE_MODULE = "sentence_transformers.models.Normalize"
# 1_Pooling/config.json's flags, in the order sentence-transformers concatenates them; one is set.
_MODE_KEYS: dict[str, PoolingMode] = {"pooling_mode_cls_token": "cls", "pooling_mode_mean_tokens": "mean",
                                      "pooling_mode_lasttoken": "last"}


@dataclass(frozen=True, slots=True)
class Pooling:
    mode: PoolingMode
    normalize: bool

    def as_dict(self) -> dict[str, Any]:
        return {"mode": self.mode, "normalize": self.normalize}


def read_pooling(model_path: str, is_encoder: bool) -> Pooling:
    """The folder's pooling (its kind's default without `modules.json`). An unknown or combined
    pooling mode raises ValueError: serving it another way would answer different vectors."""
    default = Pooling("mean" if is_encoder else "last", True)
    modules = _read_json(os.path.join(model_path, "modules.json"))
    if not isinstance(modules, list):
        return default
    types = {m.get("type"): m.get("path", "") for m in modules if isinstance(m, dict)}
    if POOLING_MODULE not in types:
        return Pooling(default.mode, NORMALIZE_MODULE in types)
    config = _read_json(os.path.join(model_path, str(types[POOLING_MODULE]), "config.json")) or {}
    modes = [mode for key, mode in _MODE_KEYS.items() if config.get(key)]
    others = [k for k, v in config.items() if k.startswith("pooling_mode_") and v and k not in _MODE_KEYS]
    if len(modes) != 1 or others:
        raise ValueError(f"unsupported sentence-transformers pooling {config}: one of {list(_MODE_KEYS)} must be set")
    return Pooling(modes[0], NORMALIZE_MODULE in types)


def _read_json(path: str) -> Any:
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def normalized(vector: list[float]) -> list[float]:
    """`vector` / its L2 norm (a zero vector as it is)."""
    norm = math.sqrt(math.fsum(v * v for v in vector))
    return [v / norm for v in vector] if norm > 0 else list(vector)


def finish_embedding(raw: list[float], pooling: Pooling, dimensions: int | None = None) -> list[float]:
    """The answered vector: normalized if the model's pipeline does; cut to `dimensions` (then
    normalized again) when given."""
    vector = normalized(raw) if pooling.normalize else list(raw)
    if dimensions is not None and dimensions < len(vector):
        vector = normalized(vector[:dimensions])
    return vector


def cosine(a: list[float], b: list[float]) -> float:
    """The cosine similarity of two vectors (0 when either is zero)."""
    dot = math.fsum(x * y for x, y in zip(a, b))
    norms = math.sqrt(math.fsum(x * x for x in a)) * math.sqrt(math.fsum(y * y for y in b))
    return dot / norms if norms > 0 else 0.0
