"""OpenAI's completions and chat bodies, declared once (validator, errors and /openapi.json).

Both take OpenAI's sampling fields and SGLang's extras (`top_k`, `min_p`, `repetition_penalty`,
`min_tokens`, `ignore_eos`, `stop_token_ids`, `regex`, `json_schema`, `ebnf`, ...); `user`,
`metadata`, `store` and `service_tier` are accepted and ignored. `prompt_cache_key` is accepted as
a label (OpenAI's hint for routing requests that share a prefix to one cache; a router in front
reads it from the body): it is not a cache namespace, which `cache_salt` / `extra_key` set.
Unknown fields are a 400 naming them, as OpenAI answers. An assistant message echoed from an
answer may carry the fields this server's answers hold (`refusal`, `annotations`,
`reasoning_content`, ...): they are ignored.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AfterValidator, Field
from pydantic_core import PydanticCustomError

from tokenizer.core.fields import (
    MAX_PROMPTS,
    CacheKey,
    Count,
    Ebnf,
    JsonSchema,
    LogitBias,
    MaxTokens,
    Metadata,
    MinP,
    Parameters,
    Penalty,
    Priority,
    PromptIds,
    PromptText,
    Regex,
    RepetitionPenalty,
    Seconds,
    Seed,
    Stop,
    StopTokenIds,
    Temperature,
    ToolSchema,
    TopK,
    TopNum,
    TopP,
)
from tokenizer.core.json_bounds import Bounds, find_problem
from tokenizer.core.spec import NAME, Echo, JsonBounds, Length, Spec, string_tag
from tokenizer.core.tools import TOOL_NAME

MAX_MESSAGES = 4096
MAX_TOOLS = 256
MAX_CONTENT_CHARS = 16 << 20  # the body limit bounds it first
VAR_BOUNDS = Bounds(max_depth=8, max_string=16 * 1024, max_total=64 * 1024)
MAX_TEMPLATE_CHARS = 64 * 1024
Content = Annotated[str, Length(0, MAX_CONTENT_CHARS)]
ToolName = Annotated[str, Field(pattern=TOOL_NAME)]
VarName = Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")]


def _variables_total(variables: dict[str, Any]) -> dict[str, Any]:
    """The template variables' size in all (each value was bounded on its own)."""
    problem = find_problem(variables, Bounds(max_depth=VAR_BOUNDS.max_depth + 1, max_total=VAR_BOUNDS.max_total))
    if problem is not None:
        raise PydanticCustomError("json_bounds", problem)
    return variables


class Sampling(Spec):
    """The fields every OpenAI generation body takes besides its prompt."""

    model: NAME | None = None
    max_tokens: MaxTokens | None = None
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    temperature: Temperature | None = None
    top_p: TopP | None = None
    n: Count | None = None
    stop: Stop | None = None
    seed: Seed | None = None
    frequency_penalty: Penalty | None = None
    presence_penalty: Penalty | None = None
    logit_bias: LogitBias | None = None
    top_k: TopK | None = None
    min_p: MinP | None = None
    repetition_penalty: RepetitionPenalty | None = None
    min_tokens: MaxTokens | None = None
    ignore_eos: bool | None = None
    stop_token_ids: StopTokenIds | None = None
    skip_special_tokens: bool | None = None
    no_stop_trim: bool | None = None
    spaces_between_special_tokens: bool | None = None
    regex: Regex | None = None
    json_schema: JsonSchema | None = None
    ebnf: Ebnf | None = None
    rid: NAME | None = None
    timeout: Seconds | None = None
    priority: Priority | None = None
    cache_salt: CacheKey | None = None
    extra_key: CacheKey | None = None
    user: NAME | None = None
    prompt_cache_key: NAME | None = None  # a label: see the module docstring
    metadata: Metadata | None = None
    store: bool | None = None
    service_tier: NAME | None = None
    # SGLang's extensions that sglang-router forwards with their defaults: accepted when they ask
    # for nothing this server lacks.
    return_hidden_states: Literal[False] | None = None
    continue_final_message: Literal[False] | None = None


class StreamOptions(Spec):
    include_usage: bool | None = None


# ---------------------------------------------------------------- completions


class CompletionBody(Sampling):
    """POST /v1/completions."""

    prompt: (PromptText | Annotated[list[PromptText], Length(1, MAX_PROMPTS)] | PromptIds
             | Annotated[list[PromptIds], Length(1, MAX_PROMPTS)])
    echo: bool | None = None
    logprobs: TopNum | None = None
    suffix: None = None
    best_of: Annotated[int, Field(ge=1, le=1)] | None = None  # only 1: one sample per choice


# ---------------------------------------------------------------- chat


class TextPart(Spec):
    type: Literal["text"]
    text: Content


Parts = Annotated[list[Annotated[TextPart, Field(discriminator="type"), string_tag("type")]], Length(0, MAX_MESSAGES)]


class CalledFunction(Echo):
    name: ToolName
    arguments: Annotated[str, Length(0, 1 << 20)] | ToolSchema = "{}"


class HistoryCall(Echo):
    id: NAME | None = None
    type: Literal["function"] | None = None
    function: CalledFunction


class SystemMessage(Spec):
    role: Literal["system", "developer"]
    content: Content | Parts
    name: NAME | None = None


class UserMessage(Spec):
    role: Literal["user"]
    content: Content | Parts
    name: NAME | None = None


class AssistantMessage(Echo):
    """An assistant turn; the fields of this server's own answers that mean nothing in a prompt
    (refusal, annotations, reasoning_content, ...) are ignored."""

    role: Literal["assistant"]
    content: Content | Parts | None = None
    name: NAME | None = None
    tool_calls: Annotated[list[HistoryCall], Length(0, MAX_TOOLS)] | None = None


class ToolMessage(Spec):
    role: Literal["tool"]
    content: Content | Parts
    tool_call_id: NAME | None = None
    name: NAME | None = None


Message = Annotated[SystemMessage | UserMessage | AssistantMessage | ToolMessage, Field(discriminator="role"),
                    string_tag("role")]


class FunctionSpec(Spec):
    name: ToolName
    description: Annotated[str, Length(0, 16 * 1024)] | None = None
    parameters: Parameters | None = None
    strict: bool | None = None


class Tool(Spec):
    type: Literal["function"]
    function: FunctionSpec


class NamedFunction(Spec):
    name: ToolName


class NamedChoice(Spec):
    type: Literal["function"]
    function: NamedFunction


class JsonSchemaFormat(Spec):
    name: Annotated[str, Length(0, 64)] | None = None
    description: Annotated[str, Length(0, 4096)] | None = None
    schema_: ToolSchema = Field(alias="schema")
    strict: bool | None = None


class TextFormat(Spec):
    type: Literal["text"]


class JsonObjectFormat(Spec):
    type: Literal["json_object"]


class JsonSchemaResponse(Spec):
    type: Literal["json_schema"]
    json_schema: JsonSchemaFormat


ResponseFormat = Annotated[TextFormat | JsonObjectFormat | JsonSchemaResponse, Field(discriminator="type"),
                           string_tag("type")]


class ChatBody(Sampling):
    """POST /v1/chat/completions."""

    messages: Annotated[list[Message], Length(1, MAX_MESSAGES)]
    max_completion_tokens: MaxTokens | None = None
    logprobs: bool | None = None
    top_logprobs: TopNum | None = None
    response_format: ResponseFormat | None = None
    tools: Annotated[list[Tool], Length(0, MAX_TOOLS)] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedChoice | None = None
    parallel_tool_calls: bool | None = None
    chat_template_kwargs: Annotated[dict[VarName, Annotated[Any, JsonBounds(VAR_BOUNDS)]], Length(0, 64),
                                    AfterValidator(_variables_total)] | None = None
    chat_template: Annotated[str, Length(1, MAX_TEMPLATE_CHARS)] | None = None
    separate_reasoning: bool | None = None
    stream_reasoning: bool | None = None


Sampling.model_rebuild()
CompletionBody.model_rebuild()
ChatBody.model_rebuild()
