"""A response's output items and its typed server-sent events, folded from the core's events
(pure: payloads only; the route writes them as `event: <type>` + `data: <json>`).

Order, as OpenAI documents it (every event carries a rising `sequence_number`):

    response.created, response.in_progress
    [reasoning]  output_item.added, content_part.added, reasoning_text.delta..., reasoning_text.done,
                 content_part.done, output_item.done
    [message]    output_item.added, content_part.added, output_text.delta..., output_text.done,
                 content_part.done, output_item.done
    [each call]  output_item.added, function_call_arguments.delta... (as generated),
                 function_call_arguments.done, output_item.done
    (the items in the order the model wrote them; an answer with neither text nor calls is one
    empty message)
    response.completed | response.incomplete | response.failed (failed also ends a cancelled one)

A non-streamed response folds the same events, so both carry the same items.
"""

from __future__ import annotations

from typing import Any

from tokenizer.core.events import (
    Finished,
    ReasoningDelta,
    TextDelta,
    Tokens,
    ToolArgsDelta,
    ToolCallDone,
    ToolCallStarted,
    Update,
    Usage,
)
from tokenizer.openai.responses.output import call_item, finished, message_item, new_id, reasoning_item, text_part

TERMINAL = {"completed": "response.completed", "incomplete": "response.incomplete"}


class _OpenItem:
    """The reasoning or message item being streamed: its place, id and text so far."""

    def __init__(self, kind: str, index: int) -> None:
        self.kind, self.index = kind, index
        self.id = new_id("rs_" if kind == "reasoning" else "msg_")
        self.pieces: list[str] = []

    @property
    def text(self) -> str:
        return "".join(self.pieces)


class ResponseAnswer:
    """One response: `start()`, `update(u)` per update, `end()`; `final()` the response object."""

    named, done = True, b""

    def __init__(self, response: dict[str, Any], stream: bool) -> None:
        self.response, self.stream = response, stream
        self.items: list[dict[str, Any]] = []  # finished output items
        self.cancelled = False
        self.result: dict[str, Any] | None = None
        self.usage = Usage(0, 0, 0)
        self._seq = 0
        self._open: _OpenItem | None = None
        self._calls: dict[int, str] = {}  # call index -> its function_call item's id

    def event(self, kind: str, **fields: Any) -> dict[str, Any]:
        payload = {"type": kind, "sequence_number": self._seq, **fields}
        self._seq += 1
        return payload

    def start(self) -> list[dict[str, Any]]:
        return [self.event("response.created", response=self.response),
                self.event("response.in_progress", response=self.response)]

    def update(self, update: Update) -> list[dict[str, Any]]:
        events: list[dict[str, Any]] = []
        status = "completed"
        for e in update.events:
            if isinstance(e, Finished):
                status = "completed" if e.reason == "stop" else "incomplete"
        for e in update.events:
            if isinstance(e, ReasoningDelta):
                events += self._delta("reasoning", e.text, status)
            elif isinstance(e, TextDelta):
                events += self._delta("message", e.text, status)
            elif isinstance(e, (ToolCallStarted, ToolArgsDelta, ToolCallDone)):
                events += self._call(e, status)
            elif isinstance(e, Tokens):
                self.usage = e.usage
            elif isinstance(e, Finished):
                events += self._finish(e, status)
        return events

    def _finish(self, e: Finished, status: str) -> list[dict[str, Any]]:
        events: list[dict[str, Any]] = []
        open_message = self._open is not None and self._open.kind == "message"
        if not open_message and not any(i["type"] in ("message", "function_call") for i in self.items):
            events += self._close(status) + self._opened("message")  # an empty answer is one message too
        events += self._close(status)
        self.result = finished(self.response, self.items, e.detail, self.usage, self.cancelled)
        return events

    def end(self) -> list[dict[str, Any]]:
        """The terminal event carrying the finished response object."""
        final = self.final()
        return [self.event(TERMINAL.get(final["status"], "response.failed"), response=final)]

    def final(self) -> dict[str, Any]:
        if self.result is None:  # never finished (the runtime stopped it): a failed response
            self.result = finished(self.response, self.items, {"type": "abort"}, self.usage, self.cancelled)
        return self.result

    def error_events(self, status: int, message: str, param: str | None) -> list[dict[str, Any]]:
        return [self.event("error", code=str(status), message=message, param=param)]

    def _call(self, e: ToolCallStarted | ToolArgsDelta | ToolCallDone, status: str) -> list[dict[str, Any]]:
        if isinstance(e, ToolCallStarted):
            events = self._close(status)
            item_id = self._calls[e.call] = new_id("fc_")
            item = {"type": "function_call", "id": item_id, "call_id": e.id, "name": e.name, "arguments": "",
                    "status": "in_progress"}
            return events + [self.event("response.output_item.added", output_index=len(self.items), item=item)]
        where = {"item_id": self._calls[e.call], "output_index": len(self.items)}
        if isinstance(e, ToolArgsDelta):
            return [self.event("response.function_call_arguments.delta", **where, delta=e.text)]
        done = call_item(self._calls[e.call], e.id, e.name, e.arguments)
        self.items.append(done)
        return [self.event("response.function_call_arguments.done", **where, name=e.name, arguments=e.arguments),
                self.event("response.output_item.done", output_index=where["output_index"], item=done)]

    def _delta(self, kind: str, delta: str, status: str) -> list[dict[str, Any]]:
        events: list[dict[str, Any]] = []
        if self._open is not None and self._open.kind != kind:
            events += self._close(status)
        if self._open is None:
            events += self._opened(kind)
        item = self._open
        assert item is not None
        item.pieces.append(delta)
        name = "response.reasoning_text.delta" if kind == "reasoning" else "response.output_text.delta"
        extra: dict[str, Any] = {} if kind == "reasoning" else {"logprobs": []}
        events.append(self.event(name, item_id=item.id, output_index=item.index, content_index=0, delta=delta, **extra))
        return events

    def _opened(self, kind: str) -> list[dict[str, Any]]:
        item = self._open = _OpenItem(kind, len(self.items))
        if kind == "reasoning":
            added = {**reasoning_item(item.id, "", "in_progress"), "content": []}
            part: dict[str, Any] = {"type": "reasoning_text", "text": ""}
        else:
            added, part = message_item(item.id, None, "in_progress"), text_part("")
        return [self.event("response.output_item.added", output_index=item.index, item=added),
                self.event("response.content_part.added", item_id=item.id, output_index=item.index, content_index=0,
                           part=part)]

    def _close(self, status: str) -> list[dict[str, Any]]:
        item, self._open = self._open, None
        if item is None:
            return []
        where = {"item_id": item.id, "output_index": item.index, "content_index": 0}
        text = item.text
        if item.kind == "reasoning":
            done = reasoning_item(item.id, text, status)
            part: dict[str, Any] = {"type": "reasoning_text", "text": text}
            events = [self.event("response.reasoning_text.done", **where, text=text)]
        else:
            done, part = message_item(item.id, text, status), text_part(text)
            events = [self.event("response.output_text.done", **where, text=text, logprobs=[])]
        self.items.append(done)
        return events + [self.event("response.content_part.done", **where, part=part),
                         self.event("response.output_item.done", output_index=item.index, item=done)]
