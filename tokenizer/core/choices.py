"""One choice's output text read into events: the thinking split out (`reasoning.py`), then
tool calls parsed from the rest (`tool_calls.py`), each fed only the new text of an update.

    reader = ChoiceReader(choice, read_options)
    events = reader.read(delta, finished)   # ReasoningDelta, TextDelta, ToolCall* events
"""

from __future__ import annotations

import uuid
from collections.abc import Callable

from tokenizer.core.events import Event, ReasoningDelta, TextDelta, ToolArgsDelta, ToolCallDone, ToolCallStarted
from tokenizer.core.reasoning import ReasoningStream
from tokenizer.core.request import ReadOptions
from tokenizer.core.tool_calls import ArgumentsDelta, CallFinished, CallStarted, ContentDelta, ToolCallStream


def id_maker(prefix: str) -> Callable[[], str]:
    """Fresh call ids with the protocol's prefix (the client sends them back with results)."""
    return lambda: prefix + uuid.uuid4().hex[:24]


class ChoiceReader:
    """The reading state of one choice; see the module docstring."""

    def __init__(self, choice: int, read: ReadOptions) -> None:
        self.choice = choice
        self.thinking = ReasoningStream(read.reasoning, read.stream_reasoning) if read.reasoning else None
        self.calls = None if read.tools is None else ToolCallStream.for_plan(
            read.tools, read.tool_parser, id_maker(read.call_id_prefix))

    def read(self, delta: str, finished: bool) -> list[Event]:
        events: list[Event] = []
        if self.thinking is not None:
            thought, delta = self.thinking.push(delta, finished)
            if thought:
                events.append(ReasoningDelta(self.choice, thought))
        if self.calls is None:
            if delta:
                events.append(TextDelta(self.choice, delta))
            return events
        for item in self.calls.push(delta, finished):
            if isinstance(item, ContentDelta):
                events.append(TextDelta(self.choice, item.text))
            elif isinstance(item, CallStarted):
                events.append(ToolCallStarted(self.choice, item.index, item.id, item.name))
            elif isinstance(item, ArgumentsDelta):
                events.append(ToolArgsDelta(self.choice, item.index, item.text))
            elif isinstance(item, CallFinished):
                call = item.call
                events.append(ToolCallDone(self.choice, item.index, call.id, call.name, call.arguments))
        return events
