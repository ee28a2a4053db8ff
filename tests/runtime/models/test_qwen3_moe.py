"""Qwen3-MoE against Hugging Face transformers on a tiny random checkpoint written by the test:
8 experts, top-2, layer 0 dense (mlp_only_layers), layers 1 and 2 sparse."""

from __future__ import annotations

import copy
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch
import transformers

from kernels.moe import ROW_TILE
from runtime.contracts.config import ServerConfig
from runtime.contracts.errors import InvalidRequest, UnsupportedModel
from runtime.contracts.model_config import ModelConfig
from runtime.execution.engines import choose_engines
from runtime.execution.static_batch import StaticBatch
from runtime.execution.weights import iter_safetensors, load_model
from runtime.models import build_model
from runtime.models.qwen3_moe import SparseMoeBlock
from runtime.parallel.sharding import ShardPlan, check_shardable
from tests.runtime.execution.test_hf_parity import hf_greedy_tokens
from tests.runtime.models.test_models import CPU, model_config, our_logits, rel_err
from tests.runtime.parallel.test_parallel_layers import RankContext, ThreadGroup

TINY_MOE = dict(hidden_size=64, intermediate_size=96, moe_intermediate_size=32, num_experts=8, num_experts_per_tok=2,
                num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2, head_dim=16, vocab_size=256,
                max_position_embeddings=512, rms_norm_eps=1e-6, mlp_only_layers=[0], norm_topk_prob=True,
                tie_word_embeddings=False)


def write_moe_checkpoint(path, **extra) -> transformers.Qwen3MoeForCausalLM:
    config = transformers.Qwen3MoeConfig(**{**TINY_MOE, **extra})
    torch.manual_seed(0)
    hf = transformers.Qwen3MoeForCausalLM(config).eval()
    with torch.no_grad():
        for name, p in hf.named_parameters():
            p.normal_(1.0 if "norm" in name else 0.0, 0.2)
    hf.save_pretrained(path)
    return hf


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    path = tmp_path_factory.mktemp("qwen3_moe")
    return path, write_moe_checkpoint(path)


def prompt(n: int, seed: int) -> torch.Tensor:
    return torch.randint(0, TINY_MOE["vocab_size"], (n,), generator=torch.Generator().manual_seed(seed))


def test_config_and_layers(checkpoint):
    path, _ = checkpoint
    cfg = model_config(path)
    assert cfg.qk_norm and cfg.moe is not None
    assert (cfg.moe.num_experts, cfg.moe.top_k, cfg.moe.intermediate_size) == (8, 2, 32)
    assert cfg.moe.norm_topk_prob and cfg.moe.sparse_layers == (1, 2)
    model = build_model(cfg, torch.float32, CPU)
    assert [isinstance(layer.mlp, SparseMoeBlock) for layer in model.model.layers] == [False, True, True]


def test_sparse_step_and_expert_count_keys():
    base = {**TINY_MOE, "architectures": ["Qwen3MoeForCausalLM"], "num_hidden_layers": 6, "mlp_only_layers": [3]}
    moe = ModelConfig.from_hf({**base, "decoder_sparse_step": 2}).moe
    assert moe is not None and moe.sparse_layers == (1, 5)  # layers 2, 4, 6 counting from 1; not 3 (index)
    # Qwen's own config.json says num_experts; transformers v5 writes num_local_experts.
    v5 = {k: v for k, v in base.items() if k != "num_experts"} | {"num_local_experts": 8}
    assert ModelConfig.from_hf(v5) == ModelConfig.from_hf(base)
    with pytest.raises(UnsupportedModel, match="num_experts_per_tok=9"):
        ModelConfig.from_hf({**base, "num_experts_per_tok": 9})


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, None)])
def test_matches_hf(checkpoint, dtype, tol):
    path, hf = checkpoint
    ids = prompt(40, 1)
    model = load_model(str(path), model_config(path), dtype, CPU)
    with torch.no_grad():
        want = hf(ids[None]).logits[0]
        if tol is None:  # bf16: within 2e-2 of the fp32 reference, or as close as HF's own bf16
            tol = max(2e-2, 1.25 * rel_err(copy.deepcopy(hf).to(dtype)(ids[None]).logits[0], want))
    got = our_logits(model, ids)
    assert got.shape == want.shape and rel_err(got, want) <= tol


def test_stacked_expert_layout_loads_the_same(checkpoint):
    """transformers' in-memory layout (mlp.experts.gate_up_proj [E, 2I, H]) as a checkpoint."""
    path, hf = checkpoint
    tensors = dict(hf.state_dict())
    assert "model.layers.1.mlp.experts.gate_up_proj" in tensors and "model.layers.1.mlp.experts.down_proj" in tensors
    model = build_model(model_config(path), torch.float32, CPU)
    model.load_weights(tensors.items())
    ids = prompt(20, 2)
    with torch.no_grad():
        want = hf(ids[None]).logits[0]
    assert rel_err(our_logits(model, ids), want) <= 1e-5


def test_missing_or_unknown_expert_is_named(checkpoint):
    path, _ = checkpoint
    tensors = list(iter_safetensors(str(path)))
    model = build_model(model_config(path), torch.float32, CPU)
    with pytest.raises(ValueError, match="mlp.experts.gate_up.weight"):
        model.load_weights([(n, t) for n, t in tensors if n != "model.layers.2.mlp.experts.5.up_proj.weight"])
    extra = ("model.layers.1.mlp.experts.8.gate_proj.weight", torch.zeros(32, 64))
    with pytest.raises(UnsupportedModel, match="experts.8.gate_proj"):
        model.load_weights([*tensors, extra])


@pytest.mark.parametrize("size", [2, 4])
def test_tensor_parallel_ranks_match_one(checkpoint, size):
    """Ranks as threads (tests/runtime/parallel/test_parallel_layers.py's group): each holds its
    slice of every expert's intermediate size; the all-reduced logits are one rank's."""
    path, _ = checkpoint
    cfg, ids = model_config(path), prompt(30, 3)
    want = our_logits(load_model(str(path), cfg, torch.float32, CPU), ids)
    group = ThreadGroup(size)

    def rank_logits(rank: int) -> torch.Tensor:
        tp = RankContext(ShardPlan.build(cfg, size, rank), group.member(rank))
        model = load_model(str(path), cfg, torch.float32, CPU, tp=tp)
        experts = model.model.layers[1].mlp.experts
        assert experts.gate_up.weight.shape == (8, 2 * 32 // size, 64)
        assert experts.down.weight.shape == (8, 64, 32 // size)
        return our_logits(model, ids)

    with ThreadPoolExecutor(size) as pool:
        for got in pool.map(rank_logits, range(size)):
            assert rel_err(got, want) <= 1e-5 and torch.equal(got.argmax(-1), want.argmax(-1))


def test_tensor_parallel_needs_expert_slices():
    cfg = ModelConfig.from_hf({**TINY_MOE, "architectures": ["Qwen3MoeForCausalLM"], "moe_intermediate_size": 1})
    with pytest.raises(InvalidRequest, match="tp_size 2 is larger than the model's dimensions") as err:
        check_shardable(cfg, 2)
    assert err.value.param == "tp_size"


def test_paged_runner_greedy_matches_hf(checkpoint):
    """Batched prefill and decode through the paged KV cache give HF's greedy tokens (fp32)."""
    path, hf = checkpoint
    prompts = [prompt(n, 10 + n).tolist() for n in (5, 17, 9)]
    h = StaticBatch.create(str(path), dtype="float32", page_size=4, max_total_tokens=1024, max_running_requests=8)
    ours = h.generate_greedy(prompts, 6)
    for p, got in zip(prompts, ours, strict=True):
        assert got == hf_greedy_tokens(hf, p, 6)


@pytest.mark.parametrize("variance,tile", [(False, ROW_TILE), (True, 1)])
def test_engines_pad_expert_groups_unless_batch_variance(checkpoint, variance, tile):
    path, _ = checkpoint
    model = build_model(model_config(path), torch.float32, CPU)
    config = ServerConfig(model_path=str(path), enable_batch_variance=variance)
    choices = choose_engines(model, None, config)
    blocks = [m for m in model.modules() if isinstance(m, SparseMoeBlock)]
    assert len(blocks) == 2 and all(block.row_tile == tile for block in blocks)
    assert [c.op for c in choices] == ["expert GEMM"] and f"padded to {tile} rows" in choices[0].engine
