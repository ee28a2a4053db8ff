"""A GGUF file's metadata folder (runtime/support/gguf_metadata.py): the config, tokenizer and
chat template of the converted folder, read from the file's metadata, without weights."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from runtime.support.default_model import MARKER_FILE, ensure_converted, gguf_path
from runtime.support.gguf_metadata import METADATA_FILES
from runtime.support.tokenizer_load import load_tokenizer

TEXTS = ["Hello, world!", "  leading spaces\tand a tab\n\nnew lines", "naïve café — 日本語 🙂", "x = f(1, 2) ** 3"]


@pytest.fixture(scope="module")
def metadata_path(tmp_path_factory: pytest.TempPathFactory) -> str:
    """Written afresh (about 6 s on 2 cores), not the cached one `ensure_default_metadata` keeps."""
    return ensure_converted(gguf_path(), tmp_path_factory.mktemp("cache") / "meta", metadata_only=True)


def _json(folder: str, name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((Path(folder) / name).read_text())
    return data


def test_the_folder_has_the_converted_config_and_no_weights(metadata_path: str, default_model_path: str) -> None:
    names = {p.name for p in Path(metadata_path).iterdir()}
    assert set(METADATA_FILES) | {MARKER_FILE, "chat_template.jinja"} == names  # no safetensors
    ours, converted = _json(metadata_path, "config.json"), _json(default_model_path, "config.json")
    # The converted folder's dtype is that of its dequantized weights; the file's blocks have none.
    converted.pop("dtype")
    assert ours == converted
    assert _json(metadata_path, "generation_config.json") == _json(default_model_path, "generation_config.json")
    template = (Path(metadata_path) / "chat_template.jinja").read_text()
    assert template == (Path(default_model_path) / "chat_template.jinja").read_text()


def test_the_tokenizer_encodes_like_the_converted_one(metadata_path: str, default_model_path: str) -> None:
    ours, converted = load_tokenizer(metadata_path), load_tokenizer(default_model_path)
    chat = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2+2?"},
            {"role": "assistant", "content": "4."}, {"role": "user", "content": "And 3+3?"}]
    rendered = ours.apply_chat_template(chat, add_generation_prompt=True, tokenize=False)
    assert rendered == converted.apply_chat_template(chat, add_generation_prompt=True, tokenize=False)
    for text in [*TEXTS, rendered]:
        ids = ours(text)["input_ids"]
        assert ids == converted(text)["input_ids"]
        assert ours.decode(ids) == converted.decode(ids)
    assert ours.eos_token_id == converted.eos_token_id and ours.bos_token_id == converted.bos_token_id
