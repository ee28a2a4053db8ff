"""A stream costs time in proportion to its own length: each update touches only what is new.

Checked as invariants, not timings (scripts/bench_stream_updates.py times it): a state's take
returns only the update's news; the reasoning and tool-call readers keep only their undecided
tail (a partial tag, trailing whitespace, an open call's arguments), however long the output
grows; and the payloads of one update do not grow with the output before it.
"""

from __future__ import annotations

from typing import Any

import orjson

from runtime.contracts.messages import BatchStrOut, GenerateReq
from runtime.contracts.sampling import SamplingParams
from tokenizer.core.choices import ChoiceReader
from tokenizer.core.events import Tokens, Update, Usage
from tokenizer.core.reasoning import PARSERS, ReasoningStream
from tokenizer.core.request import ChatInput, GenRequest, PromptRequest, ReadOptions
from tokenizer.core.tool_calls import ToolCallStream
from tokenizer.core.tools import ToolChoice, ToolPlan
from tokenizer.openai.chat import ChatAnswer, ChatRequest
from tokenizer.openai.common import Header
from tokenizer.request_state import Group, ReqState, apply_output, take_delta

STEPS = 4000
PLAN = ToolPlan([{"name": "f", "parameters": {"type": "object"}}], ToolChoice("auto"))


def _out(text: str, token: int, finished: bool) -> BatchStrOut:
    return BatchStrOut(["q"], [{"type": "stop"} if finished else None], [text], [[token]], [3], [token + 1], [0],
                       [None], [None], [None], [None], [None])


def test_a_take_returns_only_the_news() -> None:
    req = GenerateReq(rid="q", input_ids=[1, 2, 3], sampling_params=SamplingParams(), stream=True)
    state = ReqState.for_request(req, Group(), False)
    for k in range(STEPS):
        apply_output(state, _out("ab", k, k == STEPS - 1), 0, 0.0, lambda ids: [None] * len(ids))
        delta = take_delta(state)
        assert (delta.text, delta.ids) == ("ab", [k])
    assert delta.finish_reason == {"type": "stop"}


def test_the_readers_keep_only_their_undecided_tail() -> None:
    thinking = ReasoningStream(PARSERS["qwen3"])
    calls = ToolCallStream(["f"], parser="hermes")
    thinking.push("<think>", False)
    for k in range(STEPS):
        thinking.push(f"step {k} ", False)
        calls.push(f"word {k} ", False)
        assert len(thinking.held) <= len("</think>") and len(calls._buf) <= len("<tool_call>"), (k, thinking.held)


def test_an_updates_payload_does_not_grow_with_the_output() -> None:
    read = ReadOptions(PARSERS["qwen3"], True, PLAN, "hermes")
    prompt = PromptRequest(ChatInput([{"role": "user", "content": "hi"}]), "r", {})
    chat = ChatRequest(GenRequest([prompt], stream=True, read=read), Header("chatcmpl-r", "m", 0), False, False)
    answer, reader = ChatAnswer(chat), ChoiceReader(0, read)
    sizes = []
    for k in range(STEPS):
        events: list[Any] = reader.read("<think>" if k == 0 else "lorem ", False)
        events.append(Tokens(0, [k], None, None, Usage(3, k + 1, 0)))
        sizes.append(sum(len(orjson.dumps(p)) for p in answer.update(Update(0, events))))
    assert max(sizes[100:]) <= max(sizes[1:100]) + 16, (max(sizes[1:100]), max(sizes[100:]))
