"""The typed event stream the core yields for every request, whatever its protocol; each
protocol's streamed and non-streamed answers are folded from it (`tokenizer/<protocol>/`).

Per update of one choice (`Update`), in this order:

    InputLogprobs       once, before anything else of the choice (when asked for)
    ReasoningDelta      thinking text (--reasoning-parser)
    TextDelta           content
    ToolCallStarted     a call is certain: its id and name
    ToolArgsDelta       its arguments as they are generated (JSON text fragments)
    ToolCallDone        the call whole
    Tokens              the update's token ids, their logprobs and the choice's counts so far
    Finished            the last event of a choice: why it ended, and its usage

The text events of a choice join to its whole output; a choice's `Finished` comes once.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

LogprobEntry = list[Any]  # [logprob | None, token_id, text | None]
TopLogprobs = list[list[LogprobEntry] | None]


@dataclass(frozen=True, slots=True)
class InputLogprobs:
    choice: int
    entries: list[LogprobEntry]
    top: TopLogprobs | None


@dataclass(frozen=True, slots=True)
class ReasoningDelta:
    choice: int
    text: str


@dataclass(frozen=True, slots=True)
class TextDelta:
    choice: int
    text: str


@dataclass(frozen=True, slots=True)
class ToolCallStarted:
    choice: int
    call: int  # the choice's calls counted from 0
    id: str
    name: str


@dataclass(frozen=True, slots=True)
class ToolArgsDelta:
    choice: int
    call: int
    text: str


@dataclass(frozen=True, slots=True)
class ToolCallDone:
    choice: int
    call: int
    id: str
    name: str
    arguments: str  # JSON text as the model wrote it (may be invalid when cut short)


@dataclass(frozen=True, slots=True)
class Usage:
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int  # prompt tokens served from the prefix cache
    pinned_tokens: int = 0  # prompt tokens the request's cache pin wrote (Anthropic's cache_control)


@dataclass(frozen=True, slots=True)
class Tokens:
    choice: int
    ids: list[int]
    logprobs: list[LogprobEntry] | None  # None: not asked for
    top: TopLogprobs | None
    usage: Usage


@dataclass(frozen=True, slots=True)
class Finished:
    """The end of a choice: `detail` is the runtime's finish reason ({"type": stop | length |
    abort, "matched": the stop string or token, "message": why it was aborted, ...}), `label`
    the client's id of the choice (its rid), `latency` seconds since arrival."""

    choice: int
    detail: dict[str, Any]
    usage: Usage
    label: str
    latency: float

    @property
    def reason(self) -> str:
        return str(self.detail.get("type"))

    @property
    def matched(self) -> Any:
        return self.detail.get("matched")


Event = (InputLogprobs | ReasoningDelta | TextDelta | ToolCallStarted | ToolArgsDelta | ToolCallDone | Tokens
         | Finished)


@dataclass(frozen=True, slots=True)
class Update:
    """One choice's events since its last update."""

    choice: int
    events: list[Event]

    @property
    def finished(self) -> Finished | None:
        last = self.events[-1] if self.events else None
        return last if isinstance(last, Finished) else None
