"""Teacher-forced scoring of a model on reference answers (the quantization tests' yardstick)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from runtime.execution.static_batch import StaticBatch


@dataclass
class Scored:
    logprobs: list[float]  # of each reference token
    argmax: list[int]  # the model's own choice at each position


def score(engine: StaticBatch, prompts: list[list[int]], answers: list[list[int]]) -> list[Scored]:
    """Teacher-force each answer after its prompt, the prompts in one batch, one decode step at a
    time (every answer is as long as the first)."""
    seqs = [engine.new_seq(p) for p in prompts]
    scored = [Scored([], []) for _ in prompts]
    for pos in range(len(answers[0])):
        logits = engine.step(seqs, keep_logits=True).last_logits.float()
        logprobs = torch.log_softmax(logits, dim=-1)
        for i, (seq, answer) in enumerate(zip(seqs, answers)):
            scored[i].logprobs.append(float(logprobs[i, answer[pos]]))
            scored[i].argmax.append(int(logits[i].argmax()))
            seq.tokens.append(answer[pos])
    engine.release(seqs)
    return scored


def greedy_and_scored(engine: StaticBatch, prompts: list[list[int]],
                       new_tokens: int) -> tuple[list[list[int]], list[Scored]]:
    """The greedy answers of `new_tokens` tokens after `prompts` (the runner's own greedy picks, as
    in `generate_greedy`), and `score(engine, prompts, answers)` from the same forwards: the
    prompts in one batch, one decode step at a time, each picked token fed back."""
    seqs = [engine.new_seq(p) for p in prompts]
    scored = [Scored([], []) for _ in prompts]
    for _ in range(new_tokens):
        result = engine.step(seqs, keep_logits=True)
        engine.append(seqs, result)
        logprobs = torch.log_softmax(result.last_logits.float(), dim=-1)
        for i, seq in enumerate(seqs):
            scored[i].logprobs.append(float(logprobs[i, seq.output[-1]]))
            scored[i].argmax.append(seq.output[-1])
    engine.release(seqs)
    return [seq.output for seq in seqs], scored


def drift_and_agreement(ours: list[Scored], bases: list[Scored], answers: list[list[int]]) -> tuple[list[float], int]:
    """Per prompt, how far the answers' mean per-token log-prob moved from the reference's
    (nats/token); and at how many positions our argmax is the reference token."""
    drift = [abs(sum(o.logprobs) - sum(b.logprobs)) / len(o.logprobs) for o, b in zip(ours, bases)]
    agree = sum(a == t for o, ref in zip(ours, answers) for a, t in zip(o.argmax, ref))
    return drift, agree
