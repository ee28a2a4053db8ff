"""A short generation demo through the in-process Engine (what `make serve` ran before the server)."""

from __future__ import annotations

from runtime.config import ServerConfig

QUESTIONS = ["What is the capital of France?", "Name three colors of the rainbow."]


def main(config: ServerConfig) -> int:
    from dataclasses import asdict

    from runtime.engine import Engine

    with Engine(**{k: v for k, v in asdict(config).items() if k != "model_path"}, model_path=config.model_path) as engine:
        tokenizer = engine.tokenizer_manager.tokenizer
        prompts = [
            tokenizer.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True, tokenize=False)
            for q in QUESTIONS
        ]
        outputs = engine.generate(prompts, {"temperature": 0, "max_new_tokens": 48})
        for question, out in zip(QUESTIONS, outputs):
            print(f"Q: {question}\nA: {out['text'].strip()}\n")
    return 0
