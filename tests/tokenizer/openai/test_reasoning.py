"""Reasoning parsers on recorded model outputs: the split, and streamed deltas (fed in every
chunking) that join to the non-streamed fields."""

from __future__ import annotations

import pytest

from tokenizer.openai.reasoning import PARSERS, ReasoningStream, split_reasoning

# Recorded shapes: Qwen3-0.6B with thinking on; DeepSeek-R1-Distill (its template opens <think>).
QWEN3 = ("<think>\nThe user asks for the capital of France. That is Paris.\n</think>\n\n"
         "The capital of France is **Paris**.")
QWEN3_NO_THINK = "The capital of France is Paris."
R1 = "Okay, 2 + 2: two and two make four.\n</think>\n\n2 + 2 = 4."
R1_TRUNCATED = "Let me think about this carefully, step by"


@pytest.mark.parametrize("parser,text,reasoning,content", [
    ("qwen3", QWEN3, "The user asks for the capital of France. That is Paris.", "The capital of France is **Paris**."),
    ("qwen3", QWEN3_NO_THINK, None, QWEN3_NO_THINK),
    ("qwen3", "<think>\nhmm", "hmm", ""),  # ended (max_tokens) inside the block
    ("deepseek-r1", R1, "Okay, 2 + 2: two and two make four.", "2 + 2 = 4."),
    ("deepseek-r1", "<think>\n" + R1, "Okay, 2 + 2: two and two make four.", "2 + 2 = 4."),
    ("deepseek-r1", R1_TRUNCATED, R1_TRUNCATED, ""),
])
def test_split(parser: str, text: str, reasoning: str | None, content: str) -> None:
    split = split_reasoning(text, PARSERS[parser])
    assert (split.reasoning, split.content) == (reasoning, content)


@pytest.mark.parametrize("parser,text", [("qwen3", QWEN3), ("qwen3", QWEN3_NO_THINK), ("qwen3", "<think>\nhmm"),
                                         ("deepseek-r1", R1), ("deepseek-r1", R1_TRUNCATED)])
@pytest.mark.parametrize("step", [1, 2, 3, 7])
@pytest.mark.parametrize("stream_reasoning", [True, False])
def test_streamed_deltas_join_to_the_split(parser: str, text: str, step: int, stream_reasoning: bool) -> None:
    fmt = PARSERS[parser]
    stream = ReasoningStream(fmt, stream_reasoning)
    reasoning, sent_content, content = "", "", ""
    ends = list(range(step, len(text), step)) + [len(text)]
    for end in ends:
        delta, content = stream.feed(text[:end], finished=end == len(text))
        reasoning += delta
        assert content.startswith(sent_content)  # the content only grows
        sent_content = content
        assert fmt.end not in reasoning
    split = split_reasoning(text, fmt)
    assert reasoning == (split.reasoning or "") and content == split.content
