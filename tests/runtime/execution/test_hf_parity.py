"""Our paged-KV model runner against Hugging Face transformers on the same weights.

Tiny random-weight Llama (GQA), Qwen2, Qwen3, Phi-3 and Mistral checkpoints are written by the tests; the real
default model (SmolLM2-135M-Instruct) runs greedy generation for 4 chat prompts in one batch
(HF's answers to them are computed once per run, in tests/conftest.py).
"""

from __future__ import annotations

import copy

import pytest
import torch
import transformers

from runtime.execution.static_batch import StaticBatch
from tests import chat_reference

PROMPT_LENS = [5, 17, 9, 30]
DECODE_STEPS = 8


def _tiny_config(arch: str) -> transformers.PretrainedConfig:
    common = dict(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=300,
        max_position_embeddings=256,
        rms_norm_eps=1e-6,
        tie_word_embeddings=False,
    )
    if arch == "llama":
        return transformers.LlamaConfig(**common)
    if arch == "qwen2":
        return transformers.Qwen2Config(**common)
    if arch == "phi3":  # fused qkv / gate_up in the checkpoint; its default pad id is past this vocabulary
        return transformers.Phi3Config(**common, pad_token_id=0)
    if arch == "mistral":  # Mistral 7B v0.2/v0.3: no sliding window
        return transformers.MistralConfig(**common, sliding_window=None)
    return transformers.Qwen3Config(**common, head_dim=32)  # head_dim != hidden / heads


_MODEL_CLASSES = {
    "llama": transformers.LlamaForCausalLM,
    "qwen2": transformers.Qwen2ForCausalLM,
    "qwen3": transformers.Qwen3ForCausalLM,
    "phi3": transformers.Phi3ForCausalLM,
    "mistral": transformers.MistralForCausalLM,
}


@pytest.fixture(scope="module", params=["llama", "qwen2", "qwen3", "phi3", "mistral"])
def tiny_checkpoint(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    torch.manual_seed(0)
    hf = _MODEL_CLASSES[request.param](_tiny_config(request.param)).eval()
    if request.param == "qwen2":  # random q/k/v biases, so the test notices if we drop them
        for layer in hf.model.layers:
            for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                torch.nn.init.normal_(proj.bias, std=0.5)
    path = tmp_path_factory.mktemp(request.param)
    hf.save_pretrained(path)
    return str(path), hf


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm())


def _hf_last_logits(hf: torch.nn.Module, tokens: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return hf(torch.tensor([tokens])).logits[0, -1].float()


def _prompts(vocab: int) -> list[list[int]]:
    gen = torch.Generator().manual_seed(1)
    return [torch.randint(3, vocab, (n,), generator=gen).tolist() for n in PROMPT_LENS]


@pytest.mark.parametrize("page_size", [1, 4])
@pytest.mark.parametrize("dtype,tol", [("float32", 1e-4), ("bfloat16", 2e-2)])
def test_prefill_and_decode_logits(tiny_checkpoint, page_size: int, dtype: str, tol: float) -> None:
    path, hf = tiny_checkpoint
    hf_ref = copy.deepcopy(hf).to(getattr(torch, dtype))
    h = StaticBatch.create(path, dtype=dtype, page_size=page_size, max_total_tokens=1024, max_running_requests=8)
    seqs = [h.new_seq(p) for p in _prompts(300)]
    for step in range(DECODE_STEPS + 1):
        result = h.step(seqs, keep_logits=True)
        for i, s in enumerate(seqs):
            expected = _hf_last_logits(hf_ref, s.tokens)
            err = rel_err(result.last_logits[i], expected)
            assert err <= tol, f"step {step} seq {i}: relative error {err:.2e} > {tol}"
        h.append(seqs, result)


def test_chunked_prefill_matches_whole(tiny_checkpoint) -> None:
    path, _ = tiny_checkpoint
    h = StaticBatch.create(path, dtype="float32", max_total_tokens=1024, max_running_requests=4)
    prompt = _prompts(300)[3]  # 30 tokens: chunks of 11, 11, 8
    whole = h.step([h.new_seq(prompt)], keep_logits=True).last_logits[0]
    chunked_seq = h.new_seq(prompt)
    for _ in range(3):
        last = h.step([chunked_seq], chunk=11, keep_logits=True).last_logits[0]
    assert chunked_seq.computed == len(prompt)
    assert rel_err(last, whole) <= 1e-5


def test_mixed_batch_of_prefill_and_decode(tiny_checkpoint) -> None:
    """A batch where one request decodes while another prefills gives the same logits."""
    path, hf = tiny_checkpoint
    h = StaticBatch.create(path, dtype="float32", max_total_tokens=1024, max_running_requests=4)
    a, b = (h.new_seq(p) for p in _prompts(300)[:2])
    h.append([a], h.step([a]))  # a is now decoding; b has not started
    result = h.step([a, b], keep_logits=True)
    for i, s in enumerate([a, b]):
        assert rel_err(result.last_logits[i], _hf_last_logits(hf, s.tokens)) <= 1e-4


def hf_greedy_tokens(hf: torch.nn.Module, prompt: list[int], steps: int) -> list[int]:
    """HF's own greedy continuation of `prompt`, the whole sequence re-run each step (no cache)."""
    tokens = list(prompt)
    with torch.no_grad():
        for _ in range(steps):
            tokens.append(int(hf(torch.tensor([tokens])).logits[0, -1].argmax()))
    return tokens[len(prompt):]


def test_greedy_tokens_match_hf(tiny_checkpoint) -> None:
    """Greedy generation in fp32, batched, gives HF's own greedy tokens (HF runs each prompt alone)."""
    path, hf = tiny_checkpoint
    prompts = _prompts(300)
    h = StaticBatch.create(path, dtype="float32", max_total_tokens=1024, max_running_requests=8)
    ours = h.generate_greedy(prompts, DECODE_STEPS)
    for prompt, got in zip(prompts, ours, strict=True):
        assert got == hf_greedy_tokens(hf, prompt, DECODE_STEPS)


CHAT_PROMPTS = 4  # the first four of chat_reference.QUESTIONS
NEW_TOKENS = 32


@pytest.mark.slow
def test_default_model_greedy_matches_hf(default_model_path: str, default_tokenizer, chat_ids, hf_greedy) -> None:
    """HF's answers come from the run's shared reference (tests/conftest.py)."""
    assert chat_reference.HF_NEW_TOKENS == NEW_TOKENS
    ids = chat_ids[:CHAT_PROMPTS]
    h = StaticBatch.create(default_model_path, dtype="float32", max_total_tokens=4096, max_running_requests=8)
    ours = h.generate_greedy(ids, NEW_TOKENS)
    for i, expected in enumerate(hf_greedy.first(CHAT_PROMPTS)):
        # HF stops at EOS; we decode a fixed 32 tokens, so compare the part HF produced.
        assert ours[i][: len(expected)] == expected, (
            chat_reference.QUESTIONS[i], default_tokenizer.decode(ours[i]), default_tokenizer.decode(expected))
    assert "Paris" in default_tokenizer.decode(ours[0])
