"""GGUF files as model_path: served from the file alone where its blocks run (a cached metadata
folder gives the config and tokenizer), else converted once into a cached Hugging Face folder."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from runtime.contracts.config import ServerConfig
from runtime.contracts.errors import InvalidRequest
from runtime.execution.gguf_model import ensure_gguf_folder, gguf_folder, is_gguf_path
from runtime.execution.resolve import default_model_format, resolve_config
from runtime.support.default_model import ensure_default_metadata, gguf_path
from tokenizer.server_state import served_model_name


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


def test_embedded_gguf_serves_like_the_default_model(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, default_model_path: str
) -> None:
    """The embedded Q4_1 GGUF given as a path runs from its blocks with a metadata folder; asked for
    full precision, it converts once, into a folder keyed by the path, and serves from it. The
    conversion itself is the default model's (`default_model_path` made it with the same
    `convert_gguf`), so here it copies that result instead of taking 20 s again."""
    import shutil

    from safetensors import safe_open

    import runtime.support.default_model as default_model

    conversions: list[Path] = []

    def copy_default(source: Path, out: Path) -> None:
        conversions.append(source)
        shutil.copytree(default_model_path, out, dirs_exist_ok=True)

    def copy_metadata(source: Path, out: Path) -> None:
        conversions.append(source)
        shutil.copytree(default_metadata, out, dirs_exist_ok=True)

    default_metadata = default_model.ensure_default_metadata()
    monkeypatch.setattr(default_model, "convert_gguf", copy_default)
    monkeypatch.setattr(default_model, "write_gguf_metadata", copy_metadata)
    monkeypatch.setenv("RADIXSERVE_CACHE_DIR", str(tmp_path))
    source = str(gguf_path())
    # Full precision asked for: the converted folder's weights.
    resolved = resolve_config(ServerConfig(model_path=source, dtype="float32"))
    assert Path(resolved.model_path).parent == tmp_path / "gguf"
    assert resolved.load_format == "auto" and resolved.gguf_file is None
    assert resolved.tokenizer_path == resolved.model_path
    assert resolved.served_model_name == "SmolLM2-135M-Instruct.Q4_1"
    assert resolve_config(ServerConfig(model_path=source, dtype="float32")).model_path == resolved.model_path
    assert conversions == [Path(source).resolve()]  # converted once
    # By default on a CPU whose kernels are built, as with --load-format gguf: the file's blocks;
    # its metadata folder (no weights) gives the config and the tokenizer.
    monkeypatch.setattr("runtime.execution.resolve.cpu_kernels_built", lambda: True)
    again = resolve_config(ServerConfig(model_path=source))
    assert again.load_format == "gguf" and again.gguf_file == source
    assert again.model_path == resolved.model_path + "-metadata" and len(conversions) == 2
    assert again.load_format == "gguf" and again.gguf_file == source and again.tokenizer_path == again.model_path
    assert resolve_config(ServerConfig(model_path=source, load_format="gguf")).model_path == again.model_path
    assert len(conversions) == 2 and not list(Path(again.model_path).glob("*.safetensors"))
    with pytest.raises(InvalidRequest, match="no --quantization") as info:
        resolve_config(ServerConfig(model_path=source, load_format="gguf", quantization="q8_0"))
    assert info.value.param == "quantization"
    name = "model.layers.3.self_attn.q_proj.weight"
    with safe_open(str(Path(resolved.model_path) / "model.safetensors"), "pt") as ours, \
            safe_open(str(Path(default_model_path) / "model.safetensors"), "pt") as default:
        assert ours.get_tensor(name).equal(default.get_tensor(name))


def test_the_default_model_runs_its_shipped_blocks_on_cpu(default_model_path: str) -> None:
    """No model path on CPU: the Q4_1 file's blocks, with the config and tokenizer of its metadata
    and the default model's name; a dtype or a quantization asked for means full precision from
    the converted folder."""
    for asked in ({}, {"load_format": "gguf"}):
        resolved = resolve_config(ServerConfig(device="cpu", **asked))
        assert resolved.load_format == "gguf" and resolved.gguf_file == str(gguf_path())
        assert resolved.model_path == ensure_default_metadata()
        assert served_model_name(resolved) == "SmolLM2-135M-Instruct"
    for asked in ({"dtype": "float32"}, {"dtype": "bfloat16"}, {"quantization": "int8"}):
        full = resolve_config(ServerConfig(device="cpu", **asked))
        assert full.load_format == "auto" and full.gguf_file is None and full.model_path == default_model_path


def test_a_folder_with_a_gguf_file_is_used_as_given(default_model_path: str) -> None:
    """--model-path FOLDER --load-format gguf --gguf-file FILE: the folder's config and tokenizer,
    the file's blocks (the folder is not taken for a .gguf)."""
    resolved = resolve_config(ServerConfig(device="cpu", model_path=default_model_path, load_format="gguf",
                                           gguf_file=str(gguf_path())))
    assert (resolved.model_path, resolved.gguf_file, resolved.load_format) == (
        default_model_path, str(gguf_path()), "gguf")


def test_the_default_model_falls_back_to_full_precision(monkeypatch: pytest.MonkeyPatch) -> None:
    cpu = torch.device("cpu")
    assert default_model_format(ServerConfig(), cpu)[0] == "gguf"
    assert default_model_format(ServerConfig(tp_size=2), cpu)[0] == "auto"
    assert default_model_format(ServerConfig(), torch.device("cuda"))[0] == "auto"
    monkeypatch.setenv("RADIXSERVE_CPU_KERNELS", "0")  # the kernels off (or not built)
    load_format, why = default_model_format(ServerConfig(), cpu)
    assert load_format == "auto" and "kernels cannot run here" in why


def test_greedy_tokens_from_the_file_alone_equal_the_converted_folders(
    default_model_path: str, chat_ids: list[list[int]]
) -> None:
    """The same blocks, configured once by the file's metadata and once by the converted folder:
    the same greedy tokens and finishes (EOS honoured) through the real scheduler."""
    from scheduler.process import build_scheduler
    from tests.scheduler.harness import FakeIO, run_until_idle, submit

    alone = resolve_config(ServerConfig(model_path=str(gguf_path()), device="cpu", dtype="float32",
                                        load_format="gguf", max_total_tokens=1024))
    converted = alone.replace(model_path=default_model_path, tokenizer_path=default_model_path)
    results = []
    for config in (alone, converted):
        io = FakeIO()
        sched = build_scheduler(config, io)
        for i, prompt in enumerate(chat_ids[:3]):
            submit(io, f"r{i}", prompt, max_new_tokens=24, ignore_eos=False)
        results.append({rid: (r["ids"], r["finish"]) for rid, r in run_until_idle(sched, io).items()})
    assert results[0] == results[1] and len(results[0]) == 3
