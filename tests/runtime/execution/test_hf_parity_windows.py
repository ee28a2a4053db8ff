"""Sliding-window models against Hugging Face transformers: Mistral (v0.1 style), Phi-3-mini-4k
style, Gemma 2 and Gemma 3 (text), on tiny random checkpoints built from transformers' own config
classes, with prompts longer than the window so that it matters.

head_dim is 64, so on CPU the C++ prefill and decode kernels run the windowed layers (Gemma 2's
soft cap sends it to the torch paths); `test_torch_paths_alone` runs the same without them.
"""

from __future__ import annotations

import copy

import pytest
import torch
import transformers

from runtime.execution.static_batch import StaticBatch
from tests.runtime.execution.test_hf_parity import hf_greedy_tokens

PROMPT_LENS = [5, 17, 9, 30]  # two of them longer than every window
DECODE_STEPS = 8
VOCAB = 300
COMMON = dict(hidden_size=128, intermediate_size=128, num_hidden_layers=3, num_attention_heads=4,
              num_key_value_heads=2, vocab_size=VOCAB, max_position_embeddings=256, rms_norm_eps=1e-6,
              tie_word_embeddings=False)
GEMMA = dict(head_dim=64, query_pre_attn_scalar=24, sliding_window=8)


def _config(arch: str) -> transformers.PretrainedConfig:
    if arch == "mistral":  # v0.1: a window on every layer
        return transformers.MistralConfig(**COMMON, head_dim=64, sliding_window=8)
    if arch == "phi3":  # mini-4k: an odd window (2047 there); head_dim is hidden / heads
        return transformers.Phi3Config(**{**COMMON, "num_attention_heads": 2, "num_key_value_heads": 1},
                                       sliding_window=7, pad_token_id=0)
    if arch == "gemma2":  # sliding, global, sliding; caps small enough to bite
        return transformers.Gemma2Config(**COMMON, **GEMMA, attn_logit_softcapping=2.0, final_logit_softcapping=3.0)
    return transformers.Gemma3TextConfig(  # local layers with their own rope base, global ones scaled; tied head
        **{**COMMON, "tie_word_embeddings": True}, **GEMMA,
        layer_types=["sliding_attention", "full_attention", "sliding_attention"],
        rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                         "full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e6}})


_CLASSES = {"mistral": transformers.MistralForCausalLM, "phi3": transformers.Phi3ForCausalLM,
            "gemma2": transformers.Gemma2ForCausalLM, "gemma3": transformers.Gemma3ForCausalLM}


@pytest.fixture(scope="module", params=list(_CLASSES))
def windowed_checkpoint(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    torch.manual_seed(0)
    hf = _CLASSES[request.param](_config(request.param)).eval()
    with torch.no_grad():  # random norm weights: Gemma's (1 + weight) and q/k norms must matter
        for name, p in hf.named_parameters():
            if "norm" in name:
                p.normal_(0.0 if "gemma" in request.param else 1.0, 0.3)
    path = tmp_path_factory.mktemp(request.param)
    hf.save_pretrained(path)
    return str(path), hf


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm())


def _hf_last(hf: torch.nn.Module, tokens: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return hf(torch.tensor([tokens])).logits[0, -1].float()


def _prompts() -> list[list[int]]:
    gen = torch.Generator().manual_seed(1)
    return [torch.randint(3, VOCAB, (n,), generator=gen).tolist() for n in PROMPT_LENS]


def _bf16_tol(hf: torch.nn.Module) -> float:
    """2e-2, or more where HF's own bf16 run is further than that from its fp32 one."""
    prompt = _prompts()[3]
    return max(2e-2, 1.5 * rel_err(_hf_last(copy.deepcopy(hf).to(torch.bfloat16), prompt), _hf_last(hf, prompt)))


def _check_steps(path: str, hf: torch.nn.Module, dtype: str, tol: float, page_size: int) -> None:
    ref = copy.deepcopy(hf).to(getattr(torch, dtype))
    h = StaticBatch.create(path, dtype=dtype, page_size=page_size, max_total_tokens=1024, max_running_requests=8)
    seqs = [h.new_seq(p) for p in _prompts()]
    for step in range(DECODE_STEPS + 1):
        result = h.step(seqs, keep_logits=True)
        for i, s in enumerate(seqs):
            err = rel_err(result.last_logits[i], _hf_last(ref, s.tokens))
            assert err <= tol, f"step {step} seq {i}: relative error {err:.2e} > {tol}"
        h.append(seqs, result)


@pytest.mark.parametrize("page_size", [1, 4])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_prefill_and_decode_logits(windowed_checkpoint, page_size: int, dtype: str) -> None:
    path, hf = windowed_checkpoint
    _check_steps(path, hf, dtype, 1e-4 if dtype == "float32" else _bf16_tol(hf), page_size)


def test_torch_paths_alone(windowed_checkpoint, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RADIXSERVE_CPU_KERNELS", "0")
    path, hf = windowed_checkpoint
    _check_steps(path, hf, "float32", 1e-4, 1)


def test_the_window_matters(windowed_checkpoint) -> None:
    """Without its window HF's model answers the long prompt otherwise: the parity above tests it."""
    _, hf = windowed_checkpoint
    config = copy.deepcopy(hf.config)
    config.sliding_window = 4096  # longer than every prompt: no key is dropped
    unwindowed = type(hf)(config).eval()
    unwindowed.load_state_dict(hf.state_dict())
    prompt = _prompts()[3]
    assert rel_err(_hf_last(unwindowed, prompt), _hf_last(hf, prompt)) > 1e-2


@pytest.mark.parametrize("chunk", [5, 11])  # shorter and longer than the window
def test_chunked_prefill_matches_whole(windowed_checkpoint, chunk: int) -> None:
    path, _ = windowed_checkpoint
    h = StaticBatch.create(path, dtype="float32", max_total_tokens=1024, max_running_requests=4)
    prompt = _prompts()[3]
    whole = h.step([h.new_seq(prompt)], keep_logits=True).last_logits[0]
    seq = h.new_seq(prompt)
    while seq.computed < len(prompt):
        last = h.step([seq], chunk=chunk, keep_logits=True).last_logits[0]
    assert rel_err(last, whole) <= 1e-5


def test_mixed_batch_of_prefill_and_decode(windowed_checkpoint) -> None:
    path, hf = windowed_checkpoint
    h = StaticBatch.create(path, dtype="float32", max_total_tokens=1024, max_running_requests=4)
    a, b = (h.new_seq(p) for p in (_prompts()[3], _prompts()[1]))
    h.append([a], h.step([a]))  # a decodes past its window while b prefills
    result = h.step([a, b], keep_logits=True)
    for i, s in enumerate([a, b]):
        assert rel_err(result.last_logits[i], _hf_last(hf, s.tokens)) <= 1e-4


def test_greedy_tokens_match_hf(windowed_checkpoint) -> None:
    path, hf = windowed_checkpoint
    prompts = _prompts()
    h = StaticBatch.create(path, dtype="float32", max_total_tokens=1024, max_running_requests=8)
    ours = h.generate_greedy(prompts, DECODE_STEPS)
    for prompt, got in zip(prompts, ours, strict=True):
        assert got == hf_greedy_tokens(hf, prompt, DECODE_STEPS)


def test_decode_stack_reads_only_the_window(windowed_checkpoint) -> None:
    """On GGUF blocks (q8_0) a decode step's layers run as one C++ call each (decode_stack) when
    every layer has the same window, over the backend's windowed slots: the Python layers' logits,
    bit for bit. Gemma never takes the stack."""
    path, hf = windowed_checkpoint
    h = StaticBatch.create(path, dtype="float32", quantization="q8_0", max_total_tokens=1024, max_running_requests=8)
    stack = h.runner.model.model.decode_stack
    if hf.config.model_type.startswith("gemma"):
        assert stack is None
        return
    assert stack is not None

    def decode_logits(use_stack: bool) -> list[torch.Tensor]:
        h.runner.model.model.decode_stack = stack if use_stack else None
        seqs = [h.new_seq(p) for p in _prompts()]
        h.append(seqs, h.step(seqs))
        out = []
        for _ in range(4):
            result = h.step(seqs, keep_logits=True)
            out.append(result.last_logits.clone())
            h.append(seqs, result)
        h.release(seqs)
        return out

    ran = []
    original = stack.run
    stack.run = lambda *args: ran.append(original(*args)) or ran[-1]  # type: ignore[method-assign]
    try:
        stacked = decode_logits(True)
    finally:
        del stack.run
    assert len(ran) == 4 and all(out is not None for out in ran), "every decode step ran through the stack"
    for a, b in zip(stacked, decode_logits(False), strict=True):
        assert torch.equal(a, b)
