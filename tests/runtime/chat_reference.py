"""The chat prompts several runtime tests share, and Hugging Face's greedy answers to them.

Loading the tokenizer and the HF model and running `generate` costs seconds per module on a
2-core machine, so `tests/runtime/conftest.py` computes these once per run (session fixtures
`chat_ids` and `hf_greedy`) for test_engine, test_hf_parity and test_quantization.
"""

from __future__ import annotations

from typing import Any

QUESTIONS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "List three prime numbers.",
    "Explain what a radix tree is in one sentence.",
    "What is 2 + 2?",
    "Name a famous painter.",
    "Translate 'good morning' into Spanish.",
    "Give me a synonym for happy.",
]
# The longest greedy answer any user asks for. A greedy answer to fewer tokens is its prefix:
# HF's greedy generate picks each token from the same prefix either way, and stops at EOS.
HF_NEW_TOKENS = 32
EOS_ID = 2  # SmolLM2's <|im_end|>, the pad id HF's generate is given (it stops there anyway)


def chat_ids(tokenizer: Any) -> list[list[int]]:
    """Each question as a one-turn chat, rendered with the model's template and tokenized.
    (The template starts with its own special token and the tokenizer adds none, so
    add_special_tokens does not change these ids.)"""
    texts = [
        tokenizer.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True, tokenize=False)
        for q in QUESTIONS
    ]
    return [tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]


def hf_greedy(model_path: str, prompts: list[list[int]], new_tokens: int = HF_NEW_TOKENS) -> list[list[int]]:
    """HF transformers' fp32 greedy continuation of each prompt, one prompt at a time (no
    padding, so nothing but the prompt decides the numbers)."""
    import torch
    import transformers

    hf = transformers.AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).eval()
    outs = []
    with torch.no_grad():
        for ids in prompts:
            out = hf.generate(torch.tensor([ids]), max_new_tokens=new_tokens, do_sample=False, pad_token_id=EOS_ID)
            outs.append(out[0, len(ids) :].tolist())
    return outs
