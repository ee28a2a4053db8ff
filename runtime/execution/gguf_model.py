"""GGUF checkpoints as `--model-path`: a cached Hugging Face folder made once from the file.

Where the file's blocks run as they are (`--load-format gguf` on CPU,
runtime/execution/gguf_weights.py), the file alone is enough: its metadata gives a small folder
with the config, the tokenizer and the chat template and no weights
(`<RADIXSERVE_CACHE_DIR>/gguf/<stem>-<fingerprint>-metadata/`, runtime/support/gguf_metadata.py).
Full precision needs the weights: the file (any quantization transformers can read: F32, F16,
BF16, Q4_0/Q4_1/Q5/Q8_0, K-quants) is dequantized by transformers' GGUF reader into a bf16
safetensors folder with its tokenizer and config, `<RADIXSERVE_CACHE_DIR>/gguf/<stem>-<fingerprint>/`,
the same way the embedded default model is. The fingerprint covers the file's resolved path, size
and modification time, so an edited or replaced file is read again.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from runtime.contracts import env
from runtime.contracts.errors import InvalidRequest
from runtime.support.default_model import ensure_converted


def is_gguf_path(path: str | None) -> bool:
    return path is not None and path.lower().endswith(".gguf")


def gguf_folder(gguf_file: str, metadata_only: bool = False) -> Path:
    """Where the conversion of `gguf_file` (or its metadata folder) lives, whether or not it
    exists yet."""
    source = Path(gguf_file).expanduser().resolve()
    stat = source.stat()
    key = f"{source}\\0{stat.st_size}\\0{stat.st_mtime_ns}".encode()
    fingerprint = hashlib.sha256(key).hexdigest()[:12]
    suffix = "-metadata" if metadata_only else ""
    return env.cache_dir() / "gguf" / f"{source.stem}-{fingerprint}{suffix}"


def ensure_gguf_folder(gguf_file: str, metadata_only: bool = False) -> str:
    """The Hugging Face folder for `gguf_file`, converting it first if needed; `metadata_only`:
    its config and tokenizer only, for serving the file's blocks.

    Raises:
        InvalidRequest (param model_path): the file is missing or is not a readable GGUF.
    """
    if not os.path.isfile(gguf_file):
        raise InvalidRequest(f"model_path {gguf_file!r} is not a file", param="model_path")
    with open(gguf_file, "rb") as fh:
        if fh.read(4) != b"GGUF":
            raise InvalidRequest(f"model_path {gguf_file!r} is not a GGUF file (no GGUF magic)", param="model_path")
    source = Path(gguf_file).expanduser().resolve()
    return ensure_converted(source, gguf_folder(gguf_file, metadata_only), metadata_only=metadata_only)
