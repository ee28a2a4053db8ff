"""A .gguf file's linears run from their blocks (runtime/execution/gguf_weights.py): the names
and llama.cpp's q/k row order undone, and the embedded Q4_1 model against its dequantized self."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from kernels import gguf_blocks as gb
from kernels.quant_linear import BlockQuantLinearMethod
from runtime.execution.gguf_weights import _unpermute_rows, hf_name


def test_gguf_names_map_to_ours() -> None:
    assert hf_name("blk.3.attn_q.weight") == "model.layers.3.self_attn.q_proj.weight"
    assert hf_name("blk.0.ffn_down.weight") == "model.layers.0.mlp.down_proj.weight"
    assert hf_name("blk.1.attn_k.bias") == "model.layers.1.self_attn.k_proj.bias"
    assert hf_name("token_embd.weight") == "model.embed_tokens.weight"
    assert hf_name("output_norm.weight") == "model.norm.weight"
    with pytest.raises(ValueError, match="no place"):
        hf_name("blk.0.ffn_gate_exps.weight")


def test_llama_cpp_row_permutation_is_undone() -> None:
    heads, head_dim = 3, 8
    hf = torch.arange(heads * head_dim * 2, dtype=torch.float32).reshape(heads * head_dim, 2)
    # llama.cpp's convert_hf_to_gguf `permute`, as written there.
    theirs = hf.reshape(heads, 2, head_dim // 2, 2).swapaxes(1, 2).reshape(hf.shape)
    assert torch.equal(_unpermute_rows(theirs, heads), hf)


@pytest.mark.slow
def test_the_embedded_q4_1_file_runs_from_its_blocks(default_model_path: str) -> None:
    from safetensors import safe_open

    from runtime.execution.static_batch import StaticBatch
    from runtime.support.default_model import gguf_path

    engine = StaticBatch.create(str(gguf_path()), dtype="float32", load_format="gguf", max_total_tokens=256)
    model = engine.runner.model
    qkv = model.model.layers[3].self_attn.qkv_proj
    assert isinstance(qkv.method, BlockQuantLinearMethod) and qkv.method.fmt.name == "q4_1" and qkv.weight is None
    head = model.lm_head
    assert isinstance(head.method, BlockQuantLinearMethod) and head.method.fmt.name == "q8_0"  # token_embd's
    # The q rows, decoded from the blocks in our order, are the converted folder's q_proj (which
    # transformers' GGUF reader dequantized and stored in bf16).
    q_rows = gb.dequantize(qkv.method.row_blocks()[: model.config.hidden_size], qkv.method.fmt)
    with safe_open(str(Path(default_model_path) / "model.safetensors"), "pt") as f:
        folder = f.get_tensor("model.layers.3.self_attn.q_proj.weight").float()
    assert torch.allclose(q_rows, folder, rtol=1 / 128, atol=1e-6)
    block_bytes = sum(m.method.nbytes for m in model.modules() if isinstance(getattr(m, "method", None),
                                                                            BlockQuantLinearMethod))
    assert block_bytes < 100e6  # 210 q4_1 linears and the q8_0 head: about 96 MB, no fp32 copy
