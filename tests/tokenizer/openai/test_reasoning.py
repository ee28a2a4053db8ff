"""Reasoning parsers on recorded model outputs (tokenizer/core/reasoning.py): the split, and
streamed deltas (pushed in every chunking) that join to the non-streamed fields."""

from __future__ import annotations

import asyncio
import types
from typing import Any

import pytest

from runtime.contracts.config import ServerConfig
from tokenizer.admission import PromptEncoder
from tokenizer.core.pipeline import render_chats
from tokenizer.core.reasoning import PARSERS, ReasoningStream, opens_in_reasoning, split_reasoning
from tokenizer.core.request import GenRequest
from tokenizer.limits import RequestLimits
from tokenizer.manager import TokenizerManager
from tokenizer.openai.chat import parse_chat
from tokenizer.openai.responses.request import parse_response

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
    reasoning, content = "", ""
    ends = list(range(step, len(text), step)) + [len(text)]
    start = 0
    for end in ends:
        thought, said = stream.push(text[start:end], finished=end == len(text))
        start = end
        reasoning += thought
        content += said
        assert fmt.end not in reasoning and fmt.start not in content
        if not stream_reasoning and end < len(text) and split_reasoning(text[:end], fmt).open:
            assert reasoning == ""  # sent in one delta once complete
    split = split_reasoning(text, fmt)
    assert reasoning == (split.reasoning or "") and content == split.content
    assert stream.held == ""  # nothing is held once finished


def test_a_push_holds_only_the_undecided_tail() -> None:
    stream = ReasoningStream(PARSERS["qwen3"])
    assert stream.push("<thi", False) == ("", "")  # may still become the start tag
    assert stream.push("nk>\nabc  ", False) == ("abc", "")  # trailing whitespace held
    assert stream.push("def</th", False) == ("  def", "")  # a partial closing tag held
    assert stream.push("ink>\n\n", False) == ("", "")  # the gap before the content
    assert stream.push("Answer", False) == ("", "Answer")
    assert stream.push(" here.", True) == ("", " here.")
    plain = ReasoningStream(PARSERS["qwen3"])
    assert plain.push("Hello", False) == ("", "Hello")  # no block: content as it comes


# --- grammars after the reasoning: when the chat routes set grammar_after_ids ---

THINKING_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
                     "<|im_start|>assistant\n{% if enable_thinking is defined and not enable_thinking %}"
                     "<think>\n\n</think>\n\n{% endif %}")  # Qwen3's shape: it knows </think>
MESSAGES = [{"role": "user", "content": "hi"}]
PLAIN_TEMPLATE = "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}assistant:"


@pytest.mark.parametrize("parser,prompt,template,opens", [
    ("qwen3", "<|im_start|>assistant\n", THINKING_TEMPLATE, True),  # a thinking model writes <think>
    ("qwen3", "<|im_start|>assistant\n<think>\n\n</think>\n\n", THINKING_TEMPLATE, False),  # enable_thinking off
    ("qwen3", "user: what is <think>?\nassistant:", PLAIN_TEMPLATE, False),  # a model that never reasons
    ("qwen3", "<|im_start|>assistant\n<think>\n", PLAIN_TEMPLATE, True),  # the prompt opened the block
    ("deepseek-r1", "<｜Assistant｜><think>\n", PLAIN_TEMPLATE, True),
    ("deepseek-r1", "<｜Assistant｜>", PLAIN_TEMPLATE, True),  # the parser reads reasoning until </think>
    ("deepseek-r1", "<｜Assistant｜><think>\n\n</think>\n\n", PLAIN_TEMPLATE, False),
])
def test_opens_in_reasoning(parser: str, prompt: str, template: str, opens: bool) -> None:
    assert opens_in_reasoning(PARSERS[parser], prompt, template) is opens


@pytest.fixture(scope="module")
def thinking_tokenizer(default_model_path: str) -> Any:
    """The default model's tokenizer with a Qwen3-shaped template (it knows </think>)."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(default_model_path)
    tok.chat_template = THINKING_TEMPLATE
    return tok


def _manager(tokenizer: Any) -> Any:
    """What the chat pipeline reads of a TokenizerManager, with its real apply_chat_template."""
    limits = RequestLimits(vocab_size=len(tokenizer), context_length=2048, kv_total=None, max_n=4,
                           max_top_logprobs=5)
    tm = types.SimpleNamespace(tokenizer=tokenizer, encoder=PromptEncoder(tokenizer), limits=limits)
    tm.apply_chat_template = types.MethodType(TokenizerManager.apply_chat_template, tm)
    return tm


def _rendered_sampling(tokenizer: Any, req: GenRequest) -> dict[str, Any]:
    rendered = asyncio.run(render_chats(_manager(tokenizer), req))
    return dict(rendered.prompts[0].sampling)


def plan_for(tokenizer: Any, body: dict[str, Any], parser: str = "qwen3") -> dict[str, Any]:
    """The sampling params the chat pipeline sends for `body` on a server with `parser`."""
    chat = parse_chat(body, ServerConfig(reasoning_parser=parser), "m")
    return _rendered_sampling(tokenizer, chat.req)


JSON_FORMAT = {"response_format": {"type": "json_object"}}
TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {}}}}
FORCED = {"tools": [TOOL], "tool_choice": "required"}


@pytest.mark.parametrize("extra", [JSON_FORMAT, FORCED, {"regex": "[0-9]+"}], ids=["json", "forced", "regex"])
def test_a_grammar_waits_for_the_reasoning_end(thinking_tokenizer: Any, extra: dict[str, Any]) -> None:
    sampling = plan_for(thinking_tokenizer, {"messages": MESSAGES, **extra})
    assert sampling["grammar_after_ids"] == thinking_tokenizer.encode("</think>", add_special_tokens=False)


def test_a_responses_text_format_waits_for_the_reasoning_end(thinking_tokenizer: Any) -> None:
    body = {"model": "m", "input": "hi", "text": {"format": {"type": "json_object"}}}
    parsed = parse_response(body, ServerConfig(reasoning_parser="qwen3"))
    sampling = _rendered_sampling(thinking_tokenizer, parsed.request([], "resp_1"))
    assert sampling["grammar_after_ids"] == thinking_tokenizer.encode("</think>", add_special_tokens=False)


@pytest.mark.parametrize("case", ["no parser", "no grammar", "tool_choice auto", "thinking off",
                                  "no split", "a model that never reasons"])
def test_otherwise_the_grammar_applies_from_the_first_token(thinking_tokenizer: Any, tokenizer: Any,
                                                            case: str) -> None:
    body: dict[str, Any] = {"messages": MESSAGES, **JSON_FORMAT}
    tok, parser = thinking_tokenizer, "qwen3"
    if case == "no parser":
        parser = "none"
    elif case == "no grammar":
        del body["response_format"]
    elif case == "tool_choice auto":
        body = {"messages": MESSAGES, "tools": [TOOL]}
    elif case == "thinking off":
        body["chat_template_kwargs"] = {"enable_thinking": False}
    elif case == "no split":
        body["separate_reasoning"] = False
    else:
        tok = tokenizer  # SmolLM2's own template knows no <think>
    assert "grammar_after_ids" not in plan_for(tok, body, parser)


@pytest.fixture(scope="module")
def tokenizer(default_model_path: str) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(default_model_path)
