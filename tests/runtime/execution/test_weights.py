"""Checkpoint reading: single-file and sharded safetensors, dummy weights, clear errors."""

from __future__ import annotations

import os

import pytest
import torch

from runtime.execution.weights import INDEX_FILE, iter_safetensors, load_model, safetensors_files
from tests.runtime.models.test_models import CPU, TINY, model_config, our_logits, write_checkpoint


def test_single_file_and_sharded_give_identical_models(tmp_path):
    single, sharded = tmp_path / "single", tmp_path / "sharded"
    write_checkpoint(single, "qwen2", seed=3)
    write_checkpoint(sharded, "qwen2", seed=3, max_shard_size="40KB")
    assert len(safetensors_files(str(single))) == 1
    assert os.path.exists(sharded / INDEX_FILE) and len(safetensors_files(str(sharded))) > 2

    a, b = dict(iter_safetensors(str(single))), dict(iter_safetensors(str(sharded)))
    assert a.keys() == b.keys()
    assert all(torch.equal(a[name], b[name]) for name in a)

    cfg = model_config(single)
    ids = torch.arange(20) % TINY["vocab_size"]
    m1 = load_model(str(single), cfg, torch.float32, CPU)
    m2 = load_model(str(sharded), cfg, torch.float32, CPU)
    assert torch.equal(our_logits(m1, ids), our_logits(m2, ids))


def test_dummy_load_needs_no_files(tmp_path):
    write_checkpoint(tmp_path / "src", "qwen3")
    cfg = model_config(tmp_path / "src")
    missing = str(tmp_path / "nowhere")
    m1 = load_model(missing, cfg, torch.bfloat16, CPU, load_format="dummy", seed=7)
    m2 = load_model(None, cfg, torch.bfloat16, CPU, load_format="dummy", seed=7)
    ids = torch.arange(12)
    logits = our_logits(m1, ids)
    assert logits.shape == (12, TINY["vocab_size"]) and torch.isfinite(logits).all()
    assert torch.equal(logits, our_logits(m2, ids))
    norm = m1.model.layers[0].self_attn.q_norm.weight
    assert torch.equal(norm, torch.ones_like(norm))
    std = m1.model.embed_tokens.weight.float().std().item()
    assert 0.015 < std < 0.025


def test_missing_files_name_the_folder(tmp_path):
    write_checkpoint(tmp_path / "src", "llama_tied")
    cfg = model_config(tmp_path / "src")
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(FileNotFoundError, match=str(empty)):
        load_model(str(empty), cfg, torch.float32, CPU)
    os.remove(tmp_path / "src" / "model.safetensors")
    (tmp_path / "src" / INDEX_FILE).write_text('{"weight_map": {"a": "model-00001-of-00002.safetensors"}}')
    with pytest.raises(FileNotFoundError, match="model-00001-of-00002"):
        list(iter_safetensors(str(tmp_path / "src")))


def test_bad_load_format(tmp_path):
    write_checkpoint(tmp_path, "llama_tied")
    with pytest.raises(ValueError, match="load_format"):
        load_model(str(tmp_path), model_config(tmp_path), torch.float32, CPU, load_format="pt")
