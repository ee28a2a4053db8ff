"""The embedded default model (real conversion, shared per machine) and its conversion machinery
(with a fake converter in a private cache dir), plus `runtime.contracts.env` and the CLI's model-path."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest

from runtime.contracts import env
from runtime.support import default_model
from runtime.support.default_model import DEFAULT_MODEL_NAME, REQUIRED_FILES, ensure_default_model
from tokenizer.cli import main as cli_main

# ---- the real converted model ------------------------------------------------------------------

def test_folder_has_the_files(default_model_path: str) -> None:
    folder = Path(default_model_path)
    assert folder.name == DEFAULT_MODEL_NAME
    for name in REQUIRED_FILES:
        assert (folder / name).is_file(), name
    assert (folder / "model.safetensors").stat().st_size > 200_000_000


def test_config_is_smollm2_135m(default_model_path: str) -> None:
    config = json.loads((Path(default_model_path) / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"]
    assert config["num_hidden_layers"] == 30
    assert config["hidden_size"] == 576
    assert config["intermediate_size"] == 1536
    assert config["num_attention_heads"] == 9
    assert config["num_key_value_heads"] == 3
    assert config["vocab_size"] == 49152
    assert config["tie_word_embeddings"] is True
    assert "quantization_config" not in config
    generation = json.loads((Path(default_model_path) / "generation_config.json").read_text())
    assert generation["eos_token_id"] == 2


def test_weights_are_bf16_and_tied(default_model_path: str) -> None:
    from safetensors import safe_open

    with safe_open(str(Path(default_model_path) / "model.safetensors"), framework="pt") as fh:
        names = set(fh.keys())
        assert "model.embed_tokens.weight" in names
        assert "lm_head.weight" not in names  # tied to the embeddings
        embed = fh.get_slice("model.embed_tokens.weight")
        assert embed.get_dtype() == "BF16"
        assert embed.get_shape() == [49152, 576]
    assert sum(1 for n in names if n.endswith("self_attn.q_proj.weight")) == 30


def test_tokenizer_round_trip_and_special_ids(default_model_path: str) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(default_model_path)
    ids = tok.encode("Hello, radix world!")
    assert ids and ids[0] != tok.bos_token_id  # plain encode adds no BOS
    assert tok.decode(ids) == "Hello, radix world!"
    assert tok.eos_token_id == 2 and tok.eos_token == "<|im_end|>"
    assert tok.bos_token_id == 1
    assert tok.convert_tokens_to_ids("<|endoftext|>") == 0


def test_chat_template_renders(default_model_path: str) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(default_model_path)
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert isinstance(text, str)
    assert text.startswith("<|im_start|>system\n")  # the template's default system prompt
    assert "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n" in text
    assert text.endswith("<|im_start|>assistant\n")


@pytest.mark.slow
def test_greedy_answer_is_coherent(default_model_path: str) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(default_model_path)
    model = AutoModelForCausalLM.from_pretrained(default_model_path, dtype=torch.bfloat16)
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    ids = tok.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt")["input_ids"]
    with torch.inference_mode():
        out = model.generate(ids, max_new_tokens=12, do_sample=False)
    answer = tok.decode(out[0, ids.shape[1]:], skip_special_tokens=True)
    assert "Paris" in answer, answer


def test_ensure_twice_only_checks_the_folder(default_model_path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Once converted, ensure neither converts again nor waits for the conversion lock."""
    def must_not_run(*args: object, **kwargs: object) -> None:
        pytest.fail("ensure_default_model converted or locked an already complete folder")

    monkeypatch.setattr(default_model, "convert_gguf", must_not_run)
    monkeypatch.setattr(default_model, "_file_lock", must_not_run)
    again = [ensure_default_model(progress=pytest.fail) for _ in range(2)]
    assert again == [default_model_path, default_model_path]


def test_cli_model_path(default_model_path: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_main(["model-path"]) == 0
    assert capsys.readouterr().out.strip() == default_model_path


# ---- conversion machinery, with a fake converter ------------------------------------------------

@pytest.fixture
def fake_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """A private cache dir and a fast fake `convert_gguf` that counts its calls."""
    monkeypatch.setenv("RADIXSERVE_CACHE_DIR", str(tmp_path))
    calls = {"n": 0}

    def fake_convert(source: Path, out: Path) -> None:
        calls["n"] += 1
        time.sleep(0.2)
        for name in REQUIRED_FILES:
            if name != default_model.MARKER_FILE:
                (out / name).write_text("{}")

    monkeypatch.setattr(default_model, "convert_gguf", fake_convert)
    return calls


def test_cache_dir_follows_env(fake_cache: dict[str, int], tmp_path: Path) -> None:
    messages: list[str] = []
    path = ensure_default_model(progress=messages.append)
    assert path == str(tmp_path / DEFAULT_MODEL_NAME)
    assert len(messages) == 1 and path in messages[0]
    assert fake_cache["n"] == 1


def test_concurrent_callers_convert_once(fake_cache: dict[str, int]) -> None:
    results: list[str] = []
    threads = [threading.Thread(target=lambda: results.append(ensure_default_model(progress=lambda m: None)))
               for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(results) == 4 and len(set(results)) == 1
    assert fake_cache["n"] == 1


def test_interrupted_conversion_leaves_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RADIXSERVE_CACHE_DIR", str(tmp_path))

    def dies_halfway(source: Path, out: Path) -> None:
        (out / "config.json").write_text("{}")
        raise KeyboardInterrupt

    monkeypatch.setattr(default_model, "convert_gguf", dies_halfway)
    with pytest.raises(KeyboardInterrupt):
        ensure_default_model(progress=lambda m: None)
    assert not (tmp_path / DEFAULT_MODEL_NAME).exists()
    assert not list(tmp_path.glob(f".{DEFAULT_MODEL_NAME}.tmp-*"))


def test_leftovers_and_incomplete_folders_are_replaced(fake_cache: dict[str, int], tmp_path: Path) -> None:
    leftover = tmp_path / f".{DEFAULT_MODEL_NAME}.tmp-killed"
    leftover.mkdir()
    (leftover / "config.json").write_text("{}")
    half = tmp_path / DEFAULT_MODEL_NAME
    half.mkdir()
    (half / "config.json").write_text("{}")  # e.g. copied by hand: no marker, no weights
    path = Path(ensure_default_model(progress=lambda m: None))
    assert default_model.is_complete(path)
    assert not leftover.exists()
    assert fake_cache["n"] == 1


def test_older_recipe_is_rebuilt(fake_cache: dict[str, int], monkeypatch: pytest.MonkeyPatch) -> None:
    ensure_default_model(progress=lambda m: None)
    monkeypatch.setattr(default_model, "RECIPE_VERSION", default_model.RECIPE_VERSION + 1)
    ensure_default_model(progress=lambda m: None)
    assert fake_cache["n"] == 2


# ---- runtime.contracts.env ---------------------------------------------------------------------------------

def test_env_defaults_and_parsing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RADIXSERVE_CACHE_DIR", raising=False)
    assert env.cache_dir() == Path.home() / ".cache" / "radixserve"
    monkeypatch.setenv("RADIXSERVE_SOME_FLAG", "yes")
    assert env.get_bool("SOME_FLAG", False) is True
    monkeypatch.setenv("RADIXSERVE_SOME_FLAG", "maybe")
    with pytest.raises(ValueError, match="RADIXSERVE_SOME_FLAG"):
        env.get_bool("SOME_FLAG", False)
    monkeypatch.setenv("RADIXSERVE_SOME_INT", "12")
    assert env.get_int("SOME_INT", 3) == 12
    assert env.get_int("UNSET_INT", 3) == 3


@pytest.mark.gpu
def test_gpu_marker_runs_only_with_cuda() -> None:
    import torch

    assert torch.cuda.is_available()  # conftest skips this test on CPU-only machines
