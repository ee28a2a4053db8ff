"""GGUF files as model_path: converted once into a cached Hugging Face folder, then served."""

from __future__ import annotations

from pathlib import Path

import pytest

from runtime.contracts.config import ServerConfig
from runtime.contracts.errors import InvalidRequest
from runtime.execution.gguf_model import ensure_gguf_folder, gguf_folder, is_gguf_path
from runtime.execution.resolve import resolve_config
from runtime.support.default_model import gguf_path


def test_is_gguf_path() -> None:
    assert is_gguf_path("/m/x.gguf") and is_gguf_path("X.GGUF")
    assert not is_gguf_path("/m/folder") and not is_gguf_path(None)


def test_missing_or_foreign_files_are_a_400(tmp_path: Path) -> None:
    with pytest.raises(InvalidRequest, match="is not a file") as info:
        ensure_gguf_folder(str(tmp_path / "none.gguf"))
    assert info.value.param == "model_path"
    fake = tmp_path / "fake.gguf"
    fake.write_bytes(b"PK\x03\x04 not a gguf")
    with pytest.raises(InvalidRequest, match="no GGUF magic"):
        ensure_gguf_folder(str(fake))


def test_fingerprint_follows_the_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RADIXSERVE_CACHE_DIR", str(tmp_path / "cache"))
    f = tmp_path / "m.gguf"
    f.write_bytes(b"GGUF" + b"\0" * 8)
    first = gguf_folder(str(f))
    assert first.parent == tmp_path / "cache" / "gguf" and first.name.startswith("m-")
    f.write_bytes(b"GGUF" + b"\0" * 9)  # a different file under the same name
    assert gguf_folder(str(f)) != first


@pytest.mark.slow
def test_embedded_gguf_serves_like_the_default_model(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, default_model_path: str
) -> None:
    """The embedded Q4_1 GGUF given as a path converts to the same weights as the default model."""
    from safetensors import safe_open

    monkeypatch.setenv("RADIXSERVE_CACHE_DIR", str(tmp_path))
    source = str(gguf_path())
    # By default: the converted folder's weights, in full precision.
    resolved = resolve_config(ServerConfig(model_path=source))
    assert Path(resolved.model_path).parent == tmp_path / "gguf"
    assert resolved.load_format == "auto" and resolved.gguf_file is None
    assert resolved.tokenizer_path == resolved.model_path
    assert resolved.served_model_name == "SmolLM2-135M-Instruct.Q4_1"
    # --load-format gguf on CPU: the file's blocks; the folder gives the config and the tokenizer.
    again = resolve_config(ServerConfig(model_path=source, load_format="gguf"))
    assert again.model_path == resolved.model_path  # converted once
    assert again.load_format == "gguf" and again.gguf_file == source
    assert resolve_config(ServerConfig(load_format="gguf")).gguf_file == source  # the default model's file
    with pytest.raises(InvalidRequest, match="no --quantization") as info:
        resolve_config(ServerConfig(model_path=source, load_format="gguf", quantization="q8_0"))
    assert info.value.param == "quantization"
    name = "model.layers.3.self_attn.q_proj.weight"
    with safe_open(str(Path(resolved.model_path) / "model.safetensors"), "pt") as ours, \
            safe_open(str(Path(default_model_path) / "model.safetensors"), "pt") as default:
        assert ours.get_tensor(name).equal(default.get_tensor(name))
