"""Anthropic's /v1/messages and /v1/messages/count_tokens bodies, declared once (validator,
errors and /openapi.json).

Content blocks are text, tool_use (assistant) and tool_result (user); images, documents,
thinking and server tools are 400s naming the block. A block echoed from this API's answers may
carry every field Anthropic's own answers hold (`citations`, `caller`, `toolset_name`, ... as
the `anthropic` client's `model_dump()` writes them, nulls included): unused ones are ignored.
`cache_control` ({"type": "ephemeral", "ttl": "5m" | "1h"}) is taken where Anthropic takes it:
on a tool, a system text block, a message's text, tool_use and tool_result blocks (and the text
blocks inside a tool_result), and at the top level (`caching.py` says what it does).
`service_tier`, `speed` and `inference_geo` are accepted and ignored; thinking may only be
disabled. Unknown top-level fields are a 400 naming them, as Anthropic answers.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from tokenizer.core.fields import MAX_TOKENS, Parameters, StopText, ToolSchema, TopK, TopP
from tokenizer.core.spec import NAME, Echo, Length, Spec, string_tag

MAX_MESSAGES = 4096
MAX_BLOCKS = 4096
MAX_TOOLS = 256
MAX_TEXT_CHARS = 16 << 20  # the body limit bounds it first
Text = Annotated[str, Length(0, MAX_TEXT_CHARS)]
ToolName = Annotated[str, Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")]


class CacheControl(Spec):
    """A cache breakpoint: the prompt up to and including its block is kept for `ttl` (5m when
    absent)."""

    type: Literal["ephemeral"]
    ttl: Literal["5m", "1h"] | None = None


class TextBlock(Echo):
    type: Literal["text"]
    text: Text
    cache_control: CacheControl | None = None


class ToolUseBlock(Echo):
    type: Literal["tool_use"]
    id: NAME
    name: ToolName
    input: ToolSchema
    cache_control: CacheControl | None = None


class ToolResultBlock(Echo):
    type: Literal["tool_result"]
    tool_use_id: NAME
    content: Text | Annotated[list[TextBlock], Length(0, MAX_BLOCKS)] | None = None
    is_error: bool | None = None
    cache_control: CacheControl | None = None


UserBlock = Annotated[TextBlock | ToolResultBlock, Field(discriminator="type"), string_tag("type")]
AssistantBlock = Annotated[TextBlock | ToolUseBlock, Field(discriminator="type"), string_tag("type")]


class UserMessage(Spec):
    role: Literal["user"]
    content: Text | Annotated[list[UserBlock], Length(0, MAX_BLOCKS)]


class AssistantMessage(Spec):
    role: Literal["assistant"]
    content: Text | Annotated[list[AssistantBlock], Length(0, MAX_BLOCKS)]


Message = Annotated[UserMessage | AssistantMessage, Field(discriminator="role"), string_tag("role")]


class ToolSpec(Spec):
    name: ToolName
    description: Annotated[str, Length(0, 16 * 1024)] | None = None
    input_schema: Parameters
    type: Literal["custom"] | None = None
    cache_control: CacheControl | None = None


class ToolChoiceSpec(Spec):
    type: Literal["auto", "any", "tool", "none"]
    name: ToolName | None = None
    disable_parallel_tool_use: bool | None = None


class ThinkingDisabled(Spec):
    type: Literal["disabled"]


class Metadata(Spec):
    user_id: Annotated[str, Length(0, 512)] | None = None


class CountBody(Spec):
    """POST /v1/messages/count_tokens."""

    model: NAME
    messages: Annotated[list[Message], Length(1, MAX_MESSAGES)]
    system: Text | Annotated[list[TextBlock], Length(0, MAX_BLOCKS)] | None = None
    tools: Annotated[list[ToolSpec], Length(0, MAX_TOOLS)] | None = None
    tool_choice: ToolChoiceSpec | None = None
    thinking: ThinkingDisabled | None = None
    cache_control: CacheControl | None = None
    speed: NAME | None = None


class MessagesBody(CountBody):
    """POST /v1/messages."""

    max_tokens: Annotated[int, Field(ge=1, le=MAX_TOKENS)]
    stop_sequences: Annotated[list[StopText], Length(0, 16)] | None = None
    stream: bool | None = None
    temperature: Annotated[float, Field(ge=0, le=1)] | None = None
    top_p: TopP | None = None
    top_k: TopK | None = None
    metadata: Metadata | None = None
    service_tier: NAME | None = None
    inference_geo: NAME | None = None
