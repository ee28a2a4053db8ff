"""Our decoder against Hugging Face transformers on tiny random checkpoints written by the test."""

from __future__ import annotations

import copy
import os

import pytest
import torch
import torch.nn.functional as F
import transformers

from kernels.base import AttentionBackend, ForwardMetadata
from kernels.linear import RowGemvLinearMethod
from runtime.contracts.errors import UnsupportedModel
from runtime.contracts.model_config import ARCHITECTURES
from runtime.execution.cpu_kernels import load_cpu_kernels
from runtime.execution.weights import load_model
from runtime.models import MODEL_REGISTRY, ModelConfig, build_model
from runtime.models.llama import LlamaForCausalLM

CPU = torch.device("cpu")
TINY = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, vocab_size=256, max_position_embeddings=512, rms_norm_eps=1e-6)
LLAMA3_ROPE = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 64}
CHECKPOINTS = {
    "llama_tied": ("LlamaConfig", "LlamaForCausalLM", dict(tie_word_embeddings=True)),
    "llama_untied": ("LlamaConfig", "LlamaForCausalLM", dict(tie_word_embeddings=False)),
    "llama3_rope": ("LlamaConfig", "LlamaForCausalLM", dict(rope_parameters=LLAMA3_ROPE)),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", dict(tie_word_embeddings=False)),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", dict(head_dim=32, tie_word_embeddings=True)),
    # Phi3Config's default pad_token_id (32000) is past the tiny vocabulary.
    "phi3": ("Phi3Config", "Phi3ForCausalLM", dict(pad_token_id=0, tie_word_embeddings=False)),
    # Mistral 7B v0.2/v0.3: Llama's decoder, `sliding_window: null`.
    "mistral": ("MistralConfig", "MistralForCausalLM", dict(sliding_window=None, tie_word_embeddings=False)),
}


class DenseBackend(AttentionBackend):
    """Test oracle for one sequence without a cache: causal SDPA over exactly the given k/v."""

    def plan(self, meta: ForwardMetadata) -> None:
        pass

    def forward(self, layer_id: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        T, nh, d = q.shape
        group = nh // k.shape[1]
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        o = F.scaled_dot_product_attention(q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), is_causal=True)
        return o.transpose(0, 1).reshape(T, nh * d)


def write_checkpoint(path, key: str, seed: int = 0, **save_kwargs):
    """Save a tiny HF model with every weight random (biases and norms too); return it in fp32."""
    config_cls, model_cls, extra = CHECKPOINTS[key]
    config = getattr(transformers, config_cls)(**TINY, **extra)
    torch.manual_seed(seed)
    hf = getattr(transformers, model_cls)(config).eval()
    with torch.no_grad():
        for name, p in hf.named_parameters():
            p.normal_(1.0 if "norm" in name else 0.0, 0.2)
    hf.save_pretrained(path, **save_kwargs)
    return hf


def model_config(path) -> ModelConfig:
    import json

    with open(os.path.join(path, "config.json")) as fh:
        return ModelConfig.from_hf(json.load(fh))


def our_logits(model, ids: torch.Tensor) -> torch.Tensor:
    with torch.inference_mode():
        hidden = model(ids, torch.arange(len(ids)), DenseBackend())
        return model.compute_logits(hidden)


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    out = {}
    for key in CHECKPOINTS:
        path = tmp_path_factory.mktemp(key)
        out[key] = (path, write_checkpoint(path, key))
    return out


@pytest.mark.parametrize("key", list(CHECKPOINTS))
def test_matches_hf_fp32(checkpoints, key):
    path, hf = checkpoints[key]
    ids = torch.randint(0, TINY["vocab_size"], (40,), generator=torch.Generator().manual_seed(1))
    model = load_model(str(path), model_config(path), torch.float32, CPU)
    with torch.no_grad():
        want = hf(ids[None]).logits[0]
    got = our_logits(model, ids)
    assert got.dtype == torch.float32 and got.shape == want.shape
    assert rel_err(got, want) <= 1e-5
    assert rel_err(got[-1], want[-1]) <= 1e-5


@pytest.mark.parametrize("key", ["llama_tied", "qwen2", "qwen3", "phi3", "mistral"])
def test_matches_hf_bf16(checkpoints, key):
    """bf16 against the fp32 reference: within 2e-2, or at least as close as HF's own bf16 run."""
    path, hf = checkpoints[key]
    ids = torch.randint(0, TINY["vocab_size"], (40,), generator=torch.Generator().manual_seed(2))
    model = load_model(str(path), model_config(path), torch.bfloat16, CPU)
    with torch.no_grad():
        want = hf(ids[None]).logits[0]
        hf_bf16 = copy.deepcopy(hf).to(torch.bfloat16)(ids[None]).logits[0]
    got = our_logits(model, ids)
    assert got.dtype == torch.float32
    # The weights are large (std 0.2) to make attention matter, so bf16 rounding alone is ~2%.
    bound = max(2e-2, 1.25 * rel_err(hf_bf16, want))
    assert rel_err(got, want) <= bound
    assert rel_err(got[-1], want[-1]) <= max(bound, 1.25 * rel_err(hf_bf16[-1], want[-1]))


def test_unpacked_equals_packed(checkpoints):
    path, _ = checkpoints["qwen2"]
    cfg = model_config(path)
    packed = load_model(str(path), cfg, torch.float32, CPU)
    plain = build_model(cfg, torch.float32, CPU)
    from runtime.execution.weights import iter_safetensors

    plain.load_weights(iter_safetensors(str(path)))
    ids = torch.arange(30) % TINY["vocab_size"]
    assert plain.lm_head.packed is None
    if load_cpu_kernels() is not None:  # fp32 on CPU: plain rows for our GEMV, nothing packed
        assert isinstance(packed.lm_head.method, RowGemvLinearMethod) and packed.lm_head.packed is None
    else:
        assert packed.lm_head.packed is not None
    for rows in (ids[:1], ids[:4], ids):  # the GEMV's calls and oneDNN's
        assert rel_err(our_logits(packed, rows), our_logits(plain, rows)) <= 1e-5


def test_tied_and_untied(checkpoints):
    tied = load_model(str(checkpoints["llama_tied"][0]), model_config(checkpoints["llama_tied"][0]), torch.float32, CPU)
    untied_path = checkpoints["llama_untied"][0]
    untied = build_model(model_config(untied_path), torch.float32, CPU)
    assert untied.lm_head.weight is not untied.model.embed_tokens.weight
    assert tied.config.tie_word_embeddings and not untied.config.tie_word_embeddings
    # Tied: no lm_head tensor is needed, and the packed lm_head leaves the embedding in place.
    assert tied.model.embed_tokens.weight.shape == (TINY["vocab_size"], TINY["hidden_size"])
    if tied.lm_head.packed is None:  # plain rows (fp32 with our GEMV): the head reads the table itself
        assert tied.lm_head.weight is tied.model.embed_tokens.weight
    # Untied: lm_head.weight is required.
    from runtime.execution.weights import iter_safetensors

    tensors = [(n, t) for n, t in iter_safetensors(str(untied_path)) if n != "lm_head.weight"]
    with pytest.raises(ValueError, match="lm_head.weight"):
        untied.load_weights(tensors)


def test_unknown_and_missing_weights(checkpoints):
    path, _ = checkpoints["qwen3"]
    from runtime.execution.weights import iter_safetensors

    tensors = list(iter_safetensors(str(path)))
    model = build_model(model_config(path), torch.float32, CPU)
    with pytest.raises(UnsupportedModel, match="model.layers.0.mlp.bogus.weight"):
        model.load_weights(tensors + [("model.layers.0.mlp.bogus.weight", torch.zeros(1))])
    with pytest.raises(ValueError, match="qkv_proj"):
        model.load_weights([(n, t) for n, t in tensors if "k_proj" not in n])
    model.load_weights(tensors + [("model.layers.0.self_attn.rotary_emb.inv_freq", torch.zeros(4))])


def test_unknown_architecture_lists_supported():
    hf = {**TINY, "num_hidden_layers": 1, "architectures": ["GPT2LMHeadModel"]}
    with pytest.raises(UnsupportedModel) as err:
        ModelConfig.from_hf(hf)
    for name in ("LlamaForCausalLM", "MistralForCausalLM", "Phi3ForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM",
                 "Gemma2ForCausalLM", "Gemma3ForCausalLM"):
        assert name in str(err.value)
    assert set(MODEL_REGISTRY) == set(ARCHITECTURES)


def test_config_rope_formats_agree():
    base = {**TINY, "num_hidden_layers": 1, "architectures": ["LlamaForCausalLM"], "eos_token_id": [1, 2]}
    legacy_scaling = {k: v for k, v in LLAMA3_ROPE.items() if k != "rope_theta"}
    legacy = ModelConfig.from_hf({**base, "rope_theta": 500000.0, "rope_scaling": {**legacy_scaling, "type": "llama3"},
                                  "torch_dtype": "bfloat16"})
    v5 = ModelConfig.from_hf({**base, "rope_parameters": dict(LLAMA3_ROPE), "dtype": "bfloat16"})
    assert legacy == v5
    assert v5.rope_theta == 500000.0 and v5.rope_scaling["factor"] == 8.0 and v5.eos_token_ids == (1, 2)
    assert v5.torch_dtype == "bfloat16" and v5.head_dim == 16
    plain = ModelConfig.from_hf({**base, "rope_parameters": {"rope_type": "default", "rope_theta": 1e4}})
    assert plain.rope_scaling is None and plain.rope_theta == 1e4
    qwen2 = ModelConfig.from_hf({**base, "architectures": ["Qwen2ForCausalLM"]})
    assert qwen2.qkv_bias and not qwen2.o_bias and not qwen2.qk_norm
    assert ModelConfig.from_hf({**base, "architectures": ["Qwen3ForCausalLM"], "head_dim": 32}).qk_norm


def test_phi3_checkpoint_holds_fused_projections(checkpoints):
    """Phi-3's checkpoint stores qkv_proj and gate_up_proj whole: a short one is refused by name."""
    path, _ = checkpoints["phi3"]
    from runtime.execution.weights import iter_safetensors

    tensors = dict(iter_safetensors(str(path)))
    assert "model.layers.0.self_attn.qkv_proj.weight" in tensors and "model.layers.0.mlp.gate_up_proj.weight" in tensors
    model = build_model(model_config(path), torch.float32, CPU)
    name = "model.layers.1.mlp.gate_up_proj.weight"
    with pytest.raises(ValueError, match=name):
        model.load_weights([*tensors.items(), (name, tensors[name][:-1])])


PHI3 = {**TINY, "num_hidden_layers": 1, "architectures": ["Phi3ForCausalLM"], "max_position_embeddings": 4096}
LONGROPE = {"rope_type": "longrope", "rope_theta": 1e4, "short_factor": [1.0] * 8, "long_factor": [2.0] * 8,
            "original_max_position_embeddings": 4096}


@pytest.mark.parametrize("extra,match", [
    ({"rope_scaling": LONGROPE}, "rope_scaling / rope_parameters with rope_type 'longrope'"),
    ({"rope_parameters": LONGROPE}, "rope_type 'longrope'"),
    ({"partial_rotary_factor": 0.75}, "partial_rotary_factor=0.75"),  # Phi-4-mini
])
def test_phi3_configs_we_do_not_run_are_refused(extra, match):
    with pytest.raises(UnsupportedModel, match=match):
        ModelConfig.from_hf({**PHI3, **extra})


def test_phi3_window_as_long_as_the_context_is_plain_attention():
    assert ModelConfig.from_hf({**PHI3, "sliding_window": 4096}).layer_windows == ()
    assert ModelConfig.from_hf({**PHI3, "sliding_window": None}).rope_scaling is None


def test_phi3_mini_4k_window_is_served():
    """Phi-3-mini-4k: a 2047-token window (HF: a query sees its last 2047 keys) on every layer."""
    cfg = ModelConfig.from_hf({**PHI3, "num_hidden_layers": 2, "sliding_window": 2047})
    assert cfg.layer_windows == (2047, 2047) and cfg.window(1) == 2047


# Mistral 7B v0.1 as shipped: a 4096-token window over a 32k context.
MISTRAL = {**TINY, "num_hidden_layers": 1, "architectures": ["MistralForCausalLM"],
           "max_position_embeddings": 32768, "sliding_window": 4096}


def test_mistral_v01_window_is_served():
    cfg = ModelConfig.from_hf(MISTRAL)
    assert cfg.layer_windows == (4096,) and MODEL_REGISTRY[cfg.architecture] is LlamaForCausalLM
    # No max_position_embeddings: the window is compared with the context we would serve.
    no_context = {k: v for k, v in MISTRAL.items() if k != "max_position_embeddings"}
    assert ModelConfig.from_hf({**no_context, "sliding_window": 4095}).layer_windows == (4095,)
    assert ModelConfig.from_hf({**no_context, "sliding_window": 4096}).layer_windows == ()


def test_qwen2_sliding_window_stays_refused():
    """Qwen2's window applies only from `max_window_layers` on: not implemented."""
    with pytest.raises(UnsupportedModel, match="use_sliding_window"):
        ModelConfig.from_hf({**MISTRAL, "architectures": ["Qwen2ForCausalLM"], "use_sliding_window": True})


@pytest.mark.parametrize("window", [None, 32768, 65536])
def test_mistral_without_a_short_window_is_llama(window):
    cfg = ModelConfig.from_hf({**MISTRAL, "sliding_window": window})
    assert cfg.architecture == "MistralForCausalLM" and MODEL_REGISTRY[cfg.architecture] is LlamaForCausalLM
    assert cfg.max_position_embeddings == 32768 and cfg.layer_windows == ()


GEMMA2 = {**TINY, "num_hidden_layers": 4, "architectures": ["Gemma2ForCausalLM"], "head_dim": 16,
          "hidden_activation": "gelu_pytorch_tanh", "sliding_window": 8, "query_pre_attn_scalar": 24,
          "attn_logit_softcapping": 50.0, "final_logit_softcapping": 30.0}


def test_gemma_configs():
    g2 = ModelConfig.from_hf(GEMMA2)
    assert g2.layer_windows == (8, None, 8, None) and g2.attn_softcap == 50.0 and g2.final_softcap == 30.0
    assert g2.softmax_scale == 24**-0.5 and g2.hidden_act == "gelu_pytorch_tanh" and g2.rope_local_theta is None
    legacy3 = {**GEMMA2, "architectures": ["Gemma3ForCausalLM"], "num_hidden_layers": 7, "rope_theta": 1e6,
               "rope_local_base_freq": 1e4, "rope_scaling": {"rope_type": "linear", "factor": 8.0},
               "attn_logit_softcapping": None, "final_logit_softcapping": None}
    g3 = ModelConfig.from_hf(legacy3)
    assert g3.layer_windows == (8,) * 5 + (None, 8) and g3.qk_norm and g3.attn_softcap is None
    v5 = {k: v for k, v in legacy3.items() if k not in ("rope_theta", "rope_local_base_freq", "rope_scaling")}
    v5["rope_parameters"] = {"full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6},
                             "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}}
    assert ModelConfig.from_hf(v5) == g3 and g3.rope_theta == 1e6 and g3.rope_local_theta == 1e4
    assert g3.rope_scaling == {"rope_type": "linear", "factor": 8.0}
    types = ["full_attention", "sliding_attention"] * 2  # an explicit layer_types wins over the pattern
    assert ModelConfig.from_hf({**GEMMA2, "layer_types": types}).layer_windows == (None, 8, None, 8)
    with pytest.raises(UnsupportedModel, match="hidden_activation='gelu'"):
        ModelConfig.from_hf({**GEMMA2, "hidden_activation": "gelu"})


def test_default_model_matches_hf(default_model_path):
    path = default_model_path
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(path)
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    ids = torch.tensor(tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)["input_ids"])
    model = load_model(path, model_config(path), torch.float32, CPU)
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    with torch.no_grad():
        want = hf(ids[None]).logits[0, -1]
    got = our_logits(model, ids)[-1]
    assert rel_err(got, want) <= 1e-4
    assert got.argmax() == want.argmax()
