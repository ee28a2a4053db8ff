"""`runtime.support.tokenizer_load`: the direct route gives AutoTokenizer's tokenizer, and everything it
cannot vouch for (no class named, remote code, a model type AutoTokenizer overrides) goes through
AutoTokenizer itself. The launch uses it: the detokenizer loads its tokenizer without torch, and
the main process loads its own while the children start (a failure there stops them)."""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import shutil
from pathlib import Path
from typing import Any

import pytest
import transformers

from runtime.contracts.config import ServerConfig
from runtime.support.tokenizer_load import class_ref, direct_class, load_tokenizer
from tests.tokenizer.fake_scheduler import run_fake_scheduler
from tokenizer.launch import LaunchError, launch_runtime_with

TEXTS = [
    "The capital of France is",
    "<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n",
    "  leading spaces, émigré, 你好, 🙂<|endoftext|>",
    "",
]
MESSAGES = [{"role": "user", "content": "What is 2+2?"}]


def _fingerprint(tok: Any) -> dict[str, Any]:
    """Everything the three processes use of a tokenizer."""
    return {
        "class": type(tok).__qualname__,
        "encode": [tok.encode(t) for t in TEXTS],
        "encode_plain": [tok.encode(t, add_special_tokens=False) for t in TEXTS],
        "decode": [tok.decode(tok.encode(t)) for t in TEXTS],
        "decode_skip": [tok.decode(tok.encode(t), skip_special_tokens=True) for t in TEXTS],
        "chat_template": tok.chat_template,
        "chat": tok.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True),
        "special": [tok.eos_token_id, tok.bos_token_id, tok.pad_token_id, tok.unk_token_id],
        "special_ids": sorted(tok.all_special_ids),
        "added": {i: str(t) for i, t in tok.added_tokens_decoder.items()},
        "size": len(tok),
    }


@pytest.fixture(scope="module")
def auto_fingerprint(default_model_path: str) -> dict[str, Any]:
    return _fingerprint(transformers.AutoTokenizer.from_pretrained(default_model_path))


def _variant(src: str, dst: Path, model_type: str | None = None, drop: tuple[str, ...] = (),
             **tokenizer_config: Any) -> str:
    """A copy of the default model's tokenizer folder with its configs edited."""
    dst.mkdir()
    for name in ("tokenizer.json", "chat_template.jinja", "config.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(src, name), dst / name)
    tok_cfg = json.loads((dst / "tokenizer_config.json").read_text())
    tok_cfg.update(tokenizer_config)
    for key in drop:
        tok_cfg.pop(key)
    (dst / "tokenizer_config.json").write_text(json.dumps(tok_cfg))
    if model_type is not None:
        model_cfg = json.loads((dst / "config.json").read_text())
        (dst / "config.json").write_text(json.dumps(dict(model_cfg, model_type=model_type)))
    return str(dst)


def test_the_default_model_loads_directly_as_auto_tokenizer_would(
    default_model_path: str, auto_fingerprint: dict[str, Any]
) -> None:
    """Directly, and from the class ref the launcher hands the detokenizer (which then imports no
    torch: `test_the_launch_loads_..._without_torch`)."""
    assert direct_class(default_model_path) is transformers.TokenizersBackend  # the fast route is taken
    assert _fingerprint(load_tokenizer(default_model_path)) == auto_fingerprint
    ref = class_ref(default_model_path)
    assert ref == "transformers.tokenization_utils_tokenizers:TokenizersBackend"
    assert _fingerprint(load_tokenizer(default_model_path, ref)) == auto_fingerprint


def test_a_folder_without_a_named_class_goes_through_auto_tokenizer(
    default_model_path: str, tmp_path: Path, auto_fingerprint: dict[str, Any]
) -> None:
    folder = _variant(default_model_path, tmp_path / "unnamed", drop=("tokenizer_class",))
    assert direct_class(folder) is None
    assert _fingerprint(load_tokenizer(folder)) == _fingerprint(transformers.AutoTokenizer.from_pretrained(folder))


def test_remote_code_is_never_run(default_model_path: str, tmp_path: Path) -> None:
    """With an `auto_map`, AutoTokenizer decides (it runs remote code only when trusted, which
    this module never asks for); here it keeps the named local class."""
    marker = tmp_path / "ran"
    folder = _variant(default_model_path, tmp_path / "remote",
                      auto_map={"AutoTokenizer": [None, "evil.EvilTokenizer"]})
    Path(folder, "evil.py").write_text(f"open({str(marker)!r}, 'w').close()\n")
    assert direct_class(folder) is None
    unnamed = _variant(default_model_path, tmp_path / "remote_unnamed", drop=("tokenizer_class",),
                       auto_map={"AutoTokenizer": [None, "evil.EvilTokenizer"]})
    assert direct_class(unnamed) is None
    assert type(load_tokenizer(folder)) is type(transformers.AutoTokenizer.from_pretrained(folder))
    assert not marker.exists()


@pytest.mark.parametrize(("model_type", "tokenizer_class", "direct"), [
    ("qwen2", "Qwen2TokenizerFast", True),  # the class registered for the model type
    ("llama", "PreTrainedTokenizerFast", True),  # an alias of TokenizersBackend
    ("phi3", "TokenizersBackend", True),  # AutoTokenizer distrusts phi3's hub class, but registers this one
    ("qwen2", "TokenizersBackend", False),  # AutoTokenizer loads the registered Qwen2Tokenizer instead
    ("llama", "LlamaTokenizerFast", False),  # AutoTokenizer checks tokenizer.json for byte-level
])
def test_direct_class_is_auto_tokenizers_choice(
    default_model_path: str, tmp_path: Path, model_type: str, tokenizer_class: str, direct: bool
) -> None:
    """Where AutoTokenizer may override the named class, the choice is left to it."""
    folder = _variant(default_model_path, tmp_path / "v", model_type=model_type, tokenizer_class=tokenizer_class)
    auto = transformers.AutoTokenizer.from_pretrained(folder)
    assert _fingerprint(load_tokenizer(folder)) == _fingerprint(auto)
    cls = direct_class(folder)
    assert (cls is not None) == direct
    if cls is not None:
        assert cls is type(auto)


@pytest.fixture
def config(default_model_path: str) -> ServerConfig:
    from runtime.execution.resolve import resolve_config

    return resolve_config(ServerConfig(model_path=default_model_path, context_length=256))


def _maps_torch(pid: int) -> bool:
    with open(f"/proc/{pid}/maps") as fh:
        return "libtorch" in fh.read()


def test_the_launch_loads_this_tokenizer_meanwhile_and_the_detokenizer_without_torch(
    config: ServerConfig, auto_fingerprint: dict[str, Any]
) -> None:
    runtime, tokenizer = launch_runtime_with(config, lambda: load_tokenizer(config.model_path or ""),
                                             scheduler_target=run_fake_scheduler)
    try:
        assert _fingerprint(tokenizer) == auto_fingerprint
        assert runtime.scheduler_info["vocab_size"] > 0  # returned ready
        assert not _maps_torch(runtime.processes["detokenizer"].pid or 0)
        assert _maps_torch(os.getpid())  # the check can see torch where it is loaded
    finally:
        runtime.shutdown()


def test_a_main_process_failure_during_the_launch_stops_the_children(config: ServerConfig, tmp_path: Path) -> None:
    missing = str(tmp_path / "no-such-model")
    with pytest.raises(LaunchError, match="the main process failed while the children loaded: OSError"):
        launch_runtime_with(config, lambda: load_tokenizer(missing), scheduler_target=run_fake_scheduler)
    assert mp.active_children() == []
