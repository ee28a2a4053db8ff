"""The chat prompts several runtime tests share, and Hugging Face's greedy answers to them.

Loading the tokenizer and the HF model and running `generate` costs seconds per module on a
2-core machine (HF's fp32 decode runs at about 60 ms a token here), so `tests/conftest.py`
computes these once per run (session fixtures `chat_ids` and `hf_greedy`) for test_engine,
test_hf_parity and test_quantization.
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


class HFGreedy:
    """HF transformers' fp32 greedy answers (HF_NEW_TOKENS tokens, or up to EOS) to `prompts`,
    each computed on first use and kept: a module that needs the first four pays for four, and
    the run pays for each prompt once. One prompt at a time (no padding, so nothing but the
    prompt decides the numbers)."""

    def __init__(self, model_path: str, prompts: list[list[int]]) -> None:
        self.model_path = model_path
        self.prompts = prompts
        self._answers: dict[int, list[int]] = {}
        self._model: Any = None

    def first(self, count: int) -> list[list[int]]:
        """The answers to the first `count` prompts (callers must not mutate them)."""
        assert 0 < count <= len(self.prompts), count
        return [self._answer(i) for i in range(count)]

    def _answer(self, index: int) -> list[int]:
        if index not in self._answers:
            import torch

            with torch.no_grad():
                ids = self.prompts[index]
                out = self._hf().generate(torch.tensor([ids]), max_new_tokens=HF_NEW_TOKENS, do_sample=False,
                                          pad_token_id=EOS_ID)
            self._answers[index] = out[0, len(ids) :].tolist()
            if len(self._answers) == len(self.prompts):
                self._model = None  # every answer is known: free the model's memory
        return self._answers[index]

    def _hf(self) -> Any:
        if self._model is None:
            import torch
            import transformers

            self._model = transformers.AutoModelForCausalLM.from_pretrained(
                self.model_path, dtype=torch.float32).eval()
        return self._model
