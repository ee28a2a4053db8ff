"""The typed server-sent events of a streamed /v1/responses answer (pure: payloads only; the
route writes them as `event: <type>` + `data: <json>`).

Order, as OpenAI documents it (every event carries a rising `sequence_number`):

    response.created, response.in_progress
    [reasoning]  output_item.added, content_part.added, reasoning_text.delta..., reasoning_text.done,
                 content_part.done, output_item.done
    [message]    output_item.added, content_part.added, output_text.delta..., output_text.done,
                 content_part.done, output_item.done
    [each call]  output_item.added, function_call_arguments.delta... (as generated),
                 function_call_arguments.done, output_item.done
    (the items in the order the model wrote them)
    response.completed | response.incomplete | response.failed (failed also ends a cancelled one)

Text is split as the chat stream splits it: `ReasoningStream` for the thinking text and
`ToolCallStream.events` (tool_calls.py) for calls, whose arguments stream as they are generated.
NOTE: a non-streamed response is built by the same scan over its finished text (`items_of`), so
both carry the same items, in the same order, with the same text.
"""

from __future__ import annotations

from typing import Any

from tokenizer.openai.constraints import ToolPlan
from tokenizer.openai.reasoning import ReasoningFormat, ReasoningStream
from tokenizer.openai.responses.output import call_item, message_item, new_id, reasoning_item, text_part
from tokenizer.openai.tool_calls import ArgumentsDelta, CallStarted, ContentDelta, ToolCallStream, ToolEvent

TERMINAL = {"completed": "response.completed", "incomplete": "response.incomplete"}


class _OpenItem:
    """The reasoning or message item being streamed: its place, id and text so far."""

    def __init__(self, kind: str, index: int) -> None:
        self.kind, self.index = kind, index
        self.id = new_id("rs_" if kind == "reasoning" else "msg_")
        self.text = ""


class ResponseEvents:
    """One streamed response: `start()`, `feed(cumulative text, finished)` per output, `end()`."""

    def __init__(self, response: dict[str, Any], reasoning: ReasoningFormat | None, tools: ToolPlan | None,
                 tool_parser: str) -> None:
        self.response = response
        self.items: list[dict[str, Any]] = []  # finished output items
        self._seq = 0
        self._open: _OpenItem | None = None
        self._thinking = ReasoningStream(reasoning) if reasoning is not None else None
        self._calls = ToolCallStream.for_plan(tools, tool_parser) if tools is not None else None
        self._call_ids: dict[int, str] = {}  # call index -> its function_call item's id
        self._sent = 0  # content characters sent (without tools)

    def event(self, kind: str, **fields: Any) -> dict[str, Any]:
        payload = {"type": kind, "sequence_number": self._seq, **fields}
        self._seq += 1
        return payload

    def start(self) -> list[dict[str, Any]]:
        return [self.event("response.created", response=self.response),
                self.event("response.in_progress", response=self.response)]

    def feed(self, text: str, finished: bool, status: str = "completed") -> list[dict[str, Any]]:
        """Events for the cumulative output `text`; once `finished`, every item is closed
        (`status`: the finished text items' status)."""
        events: list[dict[str, Any]] = []
        if self._thinking is not None:
            thought, text = self._thinking.feed(text, finished)
            if thought:
                events += self._delta("reasoning", thought, status)
        if self._calls is not None:
            tool_events: list[ToolEvent] = self._calls.events(text, finished)
        else:
            tool_events, self._sent = [ContentDelta(text[self._sent:])], len(text)
        for event in tool_events:
            events += self._tool_event(event, status)
        if finished:
            open_message = self._open is not None and self._open.kind == "message"
            if not open_message and not any(i["type"] in ("message", "function_call") for i in self.items):
                events += self._close(status) + self._opened("message")  # an empty answer is one message too
            events += self._close(status)
        return events

    def end(self, final: dict[str, Any]) -> list[dict[str, Any]]:
        """The terminal event carrying the finished response object."""
        return [self.event(TERMINAL.get(final["status"], "response.failed"), response=final)]

    def _tool_event(self, event: ToolEvent, status: str) -> list[dict[str, Any]]:
        if isinstance(event, ContentDelta):
            return self._delta("message", event.text, status) if event.text else []
        if isinstance(event, CallStarted):
            events = self._close(status)
            item_id = self._call_ids[event.index] = new_id("fc_")
            item = {"type": "function_call", "id": item_id, "call_id": event.id, "name": event.name,
                    "arguments": "", "status": "in_progress"}
            return events + [self.event("response.output_item.added", output_index=len(self.items), item=item)]
        item_id, index = self._call_ids[event.index], len(self.items)
        where = {"item_id": item_id, "output_index": index}
        if isinstance(event, ArgumentsDelta):
            return [self.event("response.function_call_arguments.delta", **where, delta=event.text)]
        done = call_item(item_id, event.call)
        self.items.append(done)
        return [self.event("response.function_call_arguments.done", **where, name=event.call.name,
                           arguments=event.call.arguments),
                self.event("response.output_item.done", output_index=index, item=done)]

    def _delta(self, kind: str, delta: str, status: str) -> list[dict[str, Any]]:
        events: list[dict[str, Any]] = []
        if self._open is not None and self._open.kind != kind:
            events += self._close(status)
        if self._open is None:
            events += self._opened(kind)
        item = self._open
        assert item is not None
        item.text += delta
        name = "response.reasoning_text.delta" if kind == "reasoning" else "response.output_text.delta"
        extra: dict[str, Any] = {} if kind == "reasoning" else {"logprobs": []}
        events.append(self.event(name, item_id=item.id, output_index=item.index, content_index=0, delta=delta,
                                 **extra))
        return events

    def _opened(self, kind: str) -> list[dict[str, Any]]:
        item = self._open = _OpenItem(kind, len(self.items))
        if kind == "reasoning":
            added = {**reasoning_item(item.id, "", "in_progress"), "content": []}
            part = {"type": "reasoning_text", "text": ""}
        else:
            added, part = message_item(item.id, None, "in_progress"), text_part("")
        return [self.event("response.output_item.added", output_index=item.index, item=added),
                self.event("response.content_part.added", item_id=item.id, output_index=item.index,
                           content_index=0, part=part)]

    def _close(self, status: str) -> list[dict[str, Any]]:
        item, self._open = self._open, None
        if item is None:
            return []
        where = {"item_id": item.id, "output_index": item.index, "content_index": 0}
        if item.kind == "reasoning":
            done = reasoning_item(item.id, item.text, status)
            part: dict[str, Any] = {"type": "reasoning_text", "text": item.text}
            events = [self.event("response.reasoning_text.done", **where, text=item.text)]
        else:
            done, part = message_item(item.id, item.text, status), text_part(item.text)
            events = [self.event("response.output_text.done", **where, text=item.text, logprobs=[])]
        self.items.append(done)
        return events + [self.event("response.content_part.done", **where, part=part),
                         self.event("response.output_item.done", output_index=item.index, item=done)]


def items_of(text: str, status: str, reasoning: ReasoningFormat | None, tools: ToolPlan | None,
             tool_parser: str) -> list[dict[str, Any]]:
    """The output items of a finished, non-streamed output: the stream's own scan."""
    scan = ResponseEvents({}, reasoning, tools, tool_parser)
    scan.feed(text, True, status)
    return scan.items
