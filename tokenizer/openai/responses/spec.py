"""OpenAI's /v1/responses body, declared once (validator, errors and /openapi.json).

Input items are messages (`type` optional), function_call, function_call_output and reasoning
(accepted, not rendered). An item echoed from a response's `output` may carry every field
OpenAI's output items hold (ids, statuses, annotations, logprobs, ...): unused ones are ignored.
Only function tools are supported. Fields echoed into the response object (metadata, include,
user, ...) are typed and bounded here, since the stored response repeats them.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Discriminator, Field, Tag

from tokenizer.core.fields import CacheKey, MaxTokens, Metadata, Parameters, Priority, Temperature, ToolSchema, TopP
from tokenizer.core.spec import NAME, NOT_A_STRING, Echo, Length, Spec, string_tag
from tokenizer.core.tools import TOOL_NAME

MAX_ITEMS = 4096
MAX_TOOLS = 256
MAX_TEXT_CHARS = 16 << 20
Text = Annotated[str, Length(0, MAX_TEXT_CHARS)]
ToolName = Annotated[str, Field(pattern=TOOL_NAME)]
EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh")
INCLUDABLE = ("message.output_text.logprobs", "reasoning.encrypted_content", "code_interpreter_call.outputs",
              "computer_call_output.output.image_url", "file_search_call.results", "message.input_image.image_url",
              "web_search_call.action.sources", "web_search_call.results")


class TextPart(Echo):
    type: Literal["input_text", "output_text"]
    text: Text


Parts = Annotated[list[TextPart], Length(0, MAX_ITEMS)]


class MessageItem(Echo):
    type: Literal["message"] = "message"
    role: Literal["user", "assistant", "system", "developer"]
    content: Text | Parts


class FunctionCallItem(Echo):
    type: Literal["function_call"]
    call_id: NAME
    name: ToolName
    arguments: Annotated[str, Length(0, 1 << 20)]


class FunctionOutputItem(Echo):
    type: Literal["function_call_output"]
    call_id: NAME
    output: Text | Parts


class ReasoningItem(Echo):
    type: Literal["reasoning"]


def _item_kind(value: Any) -> str | None:
    kind = value.get("type", "message") if isinstance(value, dict) else None
    return kind if kind is None or isinstance(kind, str) else NOT_A_STRING  # see string_tag


Item = Annotated[Annotated[MessageItem, Tag("message")] | Annotated[FunctionCallItem, Tag("function_call")]
                 | Annotated[FunctionOutputItem, Tag("function_call_output")]
                 | Annotated[ReasoningItem, Tag("reasoning")], Discriminator(_item_kind)]


class FunctionTool(Spec):
    type: Literal["function"]
    name: ToolName
    description: Annotated[str, Length(0, 16 * 1024)] | None = None
    parameters: Parameters | None = None
    strict: bool | None = None


class NamedChoice(Spec):
    type: Literal["function"]
    name: ToolName


class TextFormat(Spec):
    type: Literal["text", "json_object"]


class JsonSchemaFormat(Spec):
    type: Literal["json_schema"]
    name: Annotated[str, Length(0, 64)] | None = None
    schema_: ToolSchema = Field(alias="schema")
    strict: bool | None = None
    description: Annotated[str, Length(0, 4096)] | None = None


class TextOptions(Spec):
    format: Annotated[TextFormat | JsonSchemaFormat, Field(discriminator="type"), string_tag("type")] | None = None
    verbosity: Literal["low", "medium", "high"] | None = None


class Reasoning(Spec):
    effort: Literal[EFFORTS] | None = None  # type: ignore[valid-type]
    summary: Literal["auto", "concise", "detailed"] | None = None
    generate_summary: Literal["auto", "concise", "detailed"] | None = None


class StreamOptions(Spec):
    include_obfuscation: bool | None = None


class ResponseBody(Spec):
    """POST /v1/responses."""

    model: NAME | None = None
    input: Text | Annotated[list[Item], Length(0, MAX_ITEMS)]
    instructions: Text | None = None
    tools: Annotated[list[FunctionTool], Length(0, MAX_TOOLS)] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedChoice | None = None
    parallel_tool_calls: bool | None = None
    max_output_tokens: MaxTokens | None = None
    text: TextOptions | None = None
    reasoning: Reasoning | None = None
    metadata: Metadata | None = None
    store: bool | None = None
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    previous_response_id: NAME | None = None
    truncation: Literal["auto", "disabled"] | None = None
    background: Literal[False] | None = None
    temperature: Temperature | None = None
    top_p: TopP | None = None
    cache_salt: CacheKey | None = None
    extra_key: CacheKey | None = None
    priority: Priority | None = None
    user: NAME | None = None
    service_tier: NAME | None = None
    prompt_cache_key: NAME | None = None
    safety_identifier: NAME | None = None
    include: Annotated[list[Literal[INCLUDABLE]], Length(0, 16)] | None = None  # type: ignore[valid-type]
