"""A message's content as Anthropic's stream events, and the plain answer folded from them, so
that a streamed message always equals the plain one (what the `anthropic` client's
`messages.stream` accumulates):

    message_start (the message without content; usage so far), ping,
    per block: content_block_start, content_block_delta..., content_block_stop
        text:     text_delta as the text grows
        tool_use: started with an empty input once the call's name is certain, then
                  input_json_delta fragments of its arguments as they are generated
    message_delta (stop_reason, stop_sequence, final usage), message_stop

With tools the output goes through the chat route's scanner (`openai/tool_calls.ToolCallStream`):
text that may start a call is held until it is decided, content and calls come in order, and
call ids are Anthropic's (`toolu_...`). Without tools the text is sent as it grows.
"""

from __future__ import annotations

from typing import Any

import orjson

from tokenizer.anthropic.message import message_body, new_tool_id, stop_of, usage
from tokenizer.anthropic.request import MessagesPlan
from tokenizer.openai.tool_calls import (
    ArgumentsDelta,
    CallFinished,
    CallStarted,
    ContentDelta,
    ToolCallStream,
    ToolEvent,
)

Event = dict[str, Any]  # its "type" is the SSE event name


class MessageEvents:
    """The events of one message, fed the manager's cumulative outputs."""

    def __init__(self, plan: MessagesPlan, model: str, parser: str) -> None:
        self.plan, self.model = plan, model
        tools = plan.conversation.tools.plan
        self._scan = None if tools is None else ToolCallStream.for_plan(tools, parser, new_tool_id)
        self._started = self._done = False
        self._open: str | None = None  # the type of the open block
        self._index = -1  # the open (or last) block's index
        self._sent = 0  # characters of text scanned (without tools)
        self._calls = 0

    def feed(self, out: dict[str, Any]) -> list[Event]:
        """The events for one cumulative output (none after the finished one)."""
        if self._done:
            return []
        meta = out["meta_info"]
        events = [] if self._started else self._start(meta)
        finished = meta.get("finish_reason") is not None
        for item in self._tool_events(out["text"], finished):
            events += self._block_events(item)
        if finished:
            events += self._finish(meta)
        return events

    def _start(self, meta: dict[str, Any]) -> list[Event]:
        self._started = True
        message = message_body(self.plan, self.model, [], None, meta)
        return [{"type": "message_start", "message": message}, {"type": "ping"}]

    def _tool_events(self, text: str, finished: bool) -> list[ToolEvent]:
        if self._scan is not None:
            return self._scan.events(text, finished)
        delta, self._sent = text[self._sent:], len(text)
        return [ContentDelta(delta)] if delta else []

    def _block_events(self, item: ToolEvent) -> list[Event]:
        if isinstance(item, ContentDelta):
            start = self._begin({"type": "text", "text": ""}) if self._open != "text" else []
            return start + [self._delta({"type": "text_delta", "text": item.text})]
        if isinstance(item, CallStarted):
            self._calls += 1
            return self._begin({"type": "tool_use", "id": item.id, "name": item.name, "input": {}})
        if isinstance(item, ArgumentsDelta):
            return [self._delta({"type": "input_json_delta", "partial_json": item.text})]
        assert isinstance(item, CallFinished)
        return self._close()

    def _begin(self, block: dict[str, Any]) -> list[Event]:
        events = self._close()
        self._index, self._open = self._index + 1, block["type"]
        return events + [{"type": "content_block_start", "index": self._index, "content_block": block}]

    def _delta(self, delta: dict[str, Any]) -> Event:
        return {"type": "content_block_delta", "index": self._index, "delta": delta}

    def _close(self) -> list[Event]:
        if self._open is None:
            return []
        self._open = None
        return [{"type": "content_block_stop", "index": self._index}]

    def _finish(self, meta: dict[str, Any]) -> list[Event]:
        """Close the last block (an empty text block when nothing was said), then the stop
        reason and usage."""
        self._done = True
        events = self._begin({"type": "text", "text": ""}) if self._index < 0 else []
        stop = stop_of(self.plan, meta, self._calls > 0)
        delta = {"stop_reason": stop.reason, "stop_sequence": stop.sequence}
        return events + self._close() + [{"type": "message_delta", "delta": delta, "usage": usage(meta)},
                                         {"type": "message_stop"}]


def fold(events: list[Event]) -> list[dict[str, Any]]:
    """The content blocks that `events` stream (a tool_use input that is not a JSON object, as
    when max_tokens cut it, is left empty)."""
    blocks: list[dict[str, Any]] = []
    args: dict[int, str] = {}
    for e in events:
        if e["type"] == "content_block_start":
            blocks.append(dict(e["content_block"]))
        elif e["type"] == "content_block_delta" and e["delta"]["type"] == "text_delta":
            blocks[e["index"]]["text"] += e["delta"]["text"]
        elif e["type"] == "content_block_delta":
            args[e["index"]] = args.get(e["index"], "") + e["delta"]["partial_json"]
    for index, text in args.items():
        try:
            value = orjson.loads(text)
        except orjson.JSONDecodeError:
            value = None
        blocks[index]["input"] = value if isinstance(value, dict) else {}
    return blocks


def final_message(plan: MessagesPlan, model: str, out: dict[str, Any], parser: str) -> dict[str, Any]:
    """The answer of a request without `stream`: its one output's events, folded. NOTE: that
    output is finished; were it not, it would count as cut short (pause_turn), never a 500."""
    meta = {**out["meta_info"], "finish_reason": out["meta_info"].get("finish_reason") or {"type": "abort"}}
    events = MessageEvents(plan, model, parser).feed({**out, "meta_info": meta})
    message: dict[str, Any] = events[0]["message"]
    delta = next(e for e in events if e["type"] == "message_delta")
    return {**message, "content": fold(events), **delta["delta"], "usage": delta["usage"]}
