"""Weight-only int8 on the default model against the unquantized model in the same dtype.

The accuracy bar: greedy tokens of the chat prompts equal the unquantized model's on at least
3 of 4 prompts for 32 tokens, and the mean log-prob of a reference answer (the unquantized
model's own) stays within 0.05 nats/token. Everything runs one request at a time, so every
decode step goes through the int8 kernel (calls of at most INT8_MAX_ROWS rows).

fp32 (the dtype of CPUs without native bf16, where int8 pays most) meets the whole bar. In bf16
greedy tokens of these prompts are at the rounding noise: the *unquantized* model run once with
our C++ decode kernel and once with torch's SDPA (both exact up to bf16 rounding) agrees on only
1 of the 4 for 32 tokens (before the top logits were refined in fp32; int8 against bf16 now agrees
on 2 of 4 on the AVX-512 machine). So in bf16 the log-prob bar is what is asserted, and the README
states the token agreement measured.
"""

from __future__ import annotations

import pytest
import torch
import transformers

from runtime.static_batch import StaticBatch

pytestmark = pytest.mark.slow

CHAT_PROMPTS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "List three prime numbers.",
    "Explain what a radix tree is in one sentence.",
]
NEW_TOKENS = 32
MIN_SAME = {"float32": 3, "bfloat16": 0}


def _score(engine: StaticBatch, prompt: list[int], answer: list[int]) -> float:
    """Mean log-prob of `answer` after `prompt`, teacher-forced one decode step at a time."""
    seq = engine.new_seq(prompt)
    total = 0.0
    for token in answer:
        logits = engine.step([seq], keep_logits=True).last_logits[0]
        total += float(torch.log_softmax(logits.float(), dim=-1)[token])
        seq.tokens.append(token)
    engine.release([seq])
    return total / len(answer)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_int8_meets_the_accuracy_bar(default_model_path: str, dtype: str) -> None:
    tok = transformers.AutoTokenizer.from_pretrained(default_model_path)
    prompts = [tok(tok.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True,
                                           tokenize=False), add_special_tokens=False)["input_ids"]
               for p in CHAT_PROMPTS]
    kw = dict(dtype=dtype, max_total_tokens=2048, max_running_requests=2)
    plain = StaticBatch.create(default_model_path, **kw)
    int8 = StaticBatch.create(default_model_path, quantization="int8", **kw)
    assert int8.runner.model.model.layers[0].mlp.down_proj.q_weight is not None
    assert int8.runner.model.lm_head.q_weight is None  # full precision, see CausalLM.quantize_int8
    same, drift = 0, []
    for prompt in prompts:
        reference = plain.generate_greedy([prompt], NEW_TOKENS)[0]
        ours = int8.generate_greedy([prompt], NEW_TOKENS)[0]
        same += ours == reference
        drift.append(abs(_score(int8, prompt, reference) - _score(plain, prompt, reference)))
    assert same >= MIN_SAME[dtype], same
    assert sum(drift) / len(drift) <= 0.05, drift
    if dtype == "float32":  # in bf16 the first token is a near-tie ("The" / "L'", 0.1 nats apart)
        answer = tok.decode(int8.generate_greedy([prompts[0]], 8)[0])
        assert "Paris" in answer, answer
