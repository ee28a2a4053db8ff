"""Load a model folder's Hugging Face tokenizer without AutoTokenizer's model-config detour.

    tokenizer = load_tokenizer(config.tokenizer_path or config.model_path)
    ref = class_ref(path)                  # in a process that has transformers' auto classes
    tokenizer = load_tokenizer(path, ref)  # in another: neither the auto classes nor torch

`AutoTokenizer.from_pretrained` first builds the model's config with `AutoConfig`, only to learn
its model type; for llama that imports transformers' configuration module and with it torch's
DTensor stack, about 1.8 s on first use in a process (each of the three server processes loads a
tokenizer). When the folder's tokenizer_config.json names its class and none of AutoTokenizer's
model-type overrides can apply, `direct_class` returns the class AutoTokenizer would pick, and
that class loads the same files the same way (AutoTokenizer ends in the same `from_pretrained`).

Everything else goes through AutoTokenizer unchanged: no class named, a folder that is not local,
a class AutoTokenizer might override for this model type, and remote code (`auto_map`), which
AutoTokenizer runs only when trusted (this module never passes trust_remote_code).

NOTE: `direct_class` mirrors AutoTokenizer's choice as of transformers 5.24; the tests compare
the two on the default model and on folders that hit each override.
"""

from __future__ import annotations

import fnmatch
import json
import os
from typing import Any

from runtime.contracts.config import ServerConfig

TOKENIZER_CONFIG = "tokenizer_config.json"
MODEL_CONFIG = "config.json"


def tokenizer_source(config: ServerConfig) -> str:
    """The folder a server's tokenizer loads from (a resolved config always has one)."""
    path = config.tokenizer_path or config.model_path
    assert path, "resolve_config(config) first"
    return path


def load_tokenizer(path: str, ref: str | None = None) -> Any:
    """The tokenizer `AutoTokenizer.from_pretrained(path)` returns, loaded directly when safe.

    Args:
        ref: `class_ref(path)` computed by another process, or None to decide here. Deciding
            imports transformers' auto classes, and with them torch (~2-4 s); a ref needs
            only the named class's module.
    """
    cls = _import_ref(ref) if ref else direct_class(path)
    if cls is None:
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(path)
    return cls.from_pretrained(path)


def direct_class(path: str) -> type[Any] | None:
    """The tokenizer class AutoTokenizer would load for the local folder `path`, or None when
    only AutoTokenizer can tell (or the folder has remote code).

    Mirrors `AutoTokenizer.from_pretrained` (transformers 5) for a folder without remote code:
    its overrides (a model id that must use TokenizersBackend, a LlamaTokenizer whose
    tokenizer.json is byte-level, a model type whose registered class differs from the named
    one) all send the folder to AutoTokenizer here; what is left is its last branch, which
    loads the named class.
    """
    if not os.path.isdir(path):
        return None
    tokenizer_config = _read_json(os.path.join(path, TOKENIZER_CONFIG))
    model_config = _read_json(os.path.join(path, MODEL_CONFIG))
    if tokenizer_config is None or model_config is None or "auto_map" in tokenizer_config:
        return None
    name = tokenizer_config.get("tokenizer_class")
    if not isinstance(name, str) or not name:
        return None
    from transformers.models.auto import tokenization_auto as auto

    if _auto_may_override(auto, path, name, model_config):
        return None
    base = name.removesuffix("Fast")
    cls = auto.tokenizer_class_from_name(base) or auto.tokenizer_class_from_name(base + "Fast")
    if cls is None:
        return None
    if cls.__name__ == "PythonBackend":
        from transformers import TokenizersBackend  # the class tokenization_auto re-exports

        return TokenizersBackend
    return cls


def class_ref(path: str) -> str | None:
    """`direct_class(path)` as "module:qualname", for `load_tokenizer(path, ref)` elsewhere."""
    cls = direct_class(path)
    return None if cls is None else f"{cls.__module__}:{cls.__qualname__}"


def _import_ref(ref: str) -> type[Any]:
    import importlib

    module, _, qualname = ref.partition(":")
    cls: type[Any] = getattr(importlib.import_module(module), qualname)
    return cls


def _auto_may_override(auto: Any, path: str, name: str, model_config: dict[str, Any]) -> bool:
    """Whether one of AutoTokenizer's overrides could pick another class than `name` here."""
    names = (path.lower(), str(model_config.get("_name_or_path", "")).lower())
    if any(fnmatch.fnmatch(n, p) for n in names for p in auto.MODEL_IDS_TO_TOKENIZERS_BACKEND):
        return True
    if name.removesuffix("Fast") == "LlamaTokenizer":
        return True  # AutoTokenizer loads TokenizersBackend when tokenizer.json is byte-level
    model_type = model_config.get("model_type")
    if not isinstance(model_type, (str, type(None))):
        return True  # a config AutoConfig may read differently: let it
    # NOTE: AutoTokenizer's list of model types with a wrong hub class (and its Mistral check)
    # only acts where the type's registered class differs from the named one, as here.
    registered = auto.TOKENIZER_MAPPING_NAMES.get(model_type) if model_type else None
    return registered is not None and registered.removesuffix("Fast") != name.removesuffix("Fast")


def _read_json(path: str) -> dict[str, Any] | None:
    """The JSON object in `path`, or None when it is missing or not one (AutoTokenizer decides)."""
    try:
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None
