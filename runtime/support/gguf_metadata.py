"""A GGUF file's metadata as a small Hugging Face folder: config, tokenizer and chat template, no
weights. Serves a `.gguf` model whose blocks run from the file itself (`--load-format gguf` on
CPU, runtime/execution/gguf_weights.py), so nothing is dequantized and no weights are written.

The folder is written by `runtime.support.default_model.ensure_converted(..., metadata_only=True)`
(cached, under a lock, atomically, like a full conversion) and holds:

    config.json              transformers' GGUF config, with `architectures` filled in
    generation_config.json   derived from that config (its EOS id and friends)
    tokenizer.json           the fast tokenizer transformers builds from `tokenizer.ggml.*`
    tokenizer_config.json    its special tokens and class
    chat_template.jinja      `tokenizer.chat_template`, when the file has one

NOTE: transformers' GGUF reader (not a parser of ours) reads the metadata: `AutoConfig` and
`AutoTokenizer` with `gguf_file=`, the same calls a full conversion makes, so both folders
describe the model the same way.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from pathlib import Path
from typing import Any

METADATA_FILES = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json")


def write_gguf_metadata(source: Path, out: Path) -> None:
    """Write the config, generation config and tokenizer of the GGUF file `source` into `out`.

    Raises:
        ValueError: transformers has no causal-LM class for the file's architecture.
    """
    from transformers import AutoConfig, AutoTokenizer, GenerationConfig
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    with quiet_transformers():
        config = AutoConfig.from_pretrained(source.parent, gguf_file=source.name)
        tokenizer = AutoTokenizer.from_pretrained(source.parent, gguf_file=source.name)
    # A model's save_pretrained names its class in `architectures`; a bare config has none, and
    # the runtime picks its model class from that list.
    arch = MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(config.model_type)
    if arch is None:
        raise ValueError(f"{source.name}: no causal LM for GGUF architecture {config.model_type!r}")
    config.architectures = [arch]
    config.save_pretrained(out)
    GenerationConfig.from_model_config(config).save_pretrained(out)
    tokenizer.save_pretrained(out)


@contextlib.contextmanager
def quiet_transformers() -> Iterator[None]:
    """Silence transformers' logging and progress bars (the GGUF dequantizer uses a bare tqdm)."""
    from transformers.utils import logging as hf_logging

    bars_were_on = hf_logging.is_progress_bar_enabled()
    verbosity = hf_logging.get_verbosity()
    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()
    patched: tuple[Any, Any] | None = None  # (module, its tqdm)
    with contextlib.suppress(ImportError):
        import transformers.modeling_gguf_pytorch_utils as gguf_utils

        if hasattr(gguf_utils, "tqdm"):
            patched = (gguf_utils, gguf_utils.tqdm)
            gguf_utils.tqdm = functools.partial(gguf_utils.tqdm, disable=True)
    try:
        yield
    finally:
        if patched is not None:
            patched[0].tqdm = patched[1]
        hf_logging.set_verbosity(verbosity)
        if bars_were_on:
            hf_logging.enable_progress_bar()
