"""The fields every protocol shares, declared once: prompts, ids, labels, the sampling fields'
types and bounds, and SGLang's `sampling_params` object built from them (the native body's; the
OpenAI and Anthropic bodies take the same types under their own names).

Ranges are `SamplingParams.validate`'s (runtime/contracts/sampling.py), which still checks what
needs the model (token ids against the vocabulary) and pairs of fields (min <= max).
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import AfterValidator, Field
from pydantic_core import PydanticCustomError

from runtime.contracts.errors import InvalidRequest
from runtime.contracts.sampling import (
    MAX_GRAMMAR_AFTER_IDS,
    MAX_LOGIT_BIAS_ENTRIES,
    MAX_STOP_STR_CHARS,
    MAX_STOP_STRS,
    MAX_STOP_TOKEN_IDS,
)
from tokenizer.core.json_bounds import Bounds
from tokenizer.core.spec import JsonBounds, Length, Spec

MAX_TOKENS = 1 << 30  # beyond any context; the context check names the real limit
TOKEN_ID = Annotated[int, Field(ge=0, lt=1 << 31)]
SCHEMA_BOUNDS = Bounds(max_depth=32, max_total=256 * 1024)
GRAMMAR_CHARS = 64 * 1024

Temperature = Annotated[float, Field(ge=0, le=1e6)]
TopP = Annotated[float, Field(gt=0, le=1)]
TopK = Annotated[int, Field(ge=-1, le=1 << 30)]
MinP = Annotated[float, Field(ge=0, le=1)]
Penalty = Annotated[float, Field(ge=-2, le=2)]
RepetitionPenalty = Annotated[float, Field(gt=0, le=2)]
MaxTokens = Annotated[int, Field(ge=0, le=MAX_TOKENS)]
Count = Annotated[int, Field(ge=1, le=1024)]  # n; the server's --max-n is checked with the model's limits
Seed = Annotated[int, Field(ge=0, lt=1 << 63)]
StopText = Annotated[str, Length(1, MAX_STOP_STR_CHARS)]
Stop = StopText | Annotated[list[StopText], Length(0, MAX_STOP_STRS)]
StopTokenIds = Annotated[list[TOKEN_ID], Length(0, MAX_STOP_TOKEN_IDS)]
LogitBias = Annotated[dict[Annotated[str, Field(pattern=r"^-?[0-9]{1,10}$")], Annotated[float, Field(ge=-100, le=100)]],
                      Length(0, MAX_LOGIT_BIAS_ENTRIES)]
Regex = Annotated[str, Length(1, GRAMMAR_CHARS)]
Ebnf = Annotated[str, Length(1, GRAMMAR_CHARS)]
SchemaObject = Annotated[dict[str, Any], JsonBounds(SCHEMA_BOUNDS, object_only=True)]
ToolSchema = SchemaObject  # a call's arguments


def _object_schema(schema: dict[str, Any]) -> dict[str, Any]:
    """A tool's parameters describe an object: a call's arguments are one (`tool_calls.py`)."""
    if schema.get("type", "object") != "object":
        raise PydanticCustomError("object_schema", "must be a JSON schema of an object (type 'object')")
    return schema


Parameters = Annotated[SchemaObject, AfterValidator(_object_schema)]  # a tool's parameters
JsonSchema = Annotated[str, Length(1, GRAMMAR_CHARS * 4)] | SchemaObject
# OpenAI's metadata bounds: at most 16 pairs, keys up to 64 characters, string values up to 512.
Metadata = Annotated[dict[Annotated[str, Length(0, 64)], Annotated[str, Length(0, 512)]], Length(0, 16)]
Interval = Annotated[int, Field(ge=1, le=1 << 20)]

MAX_PROMPTS = 4096  # the spec's bound; --max-prompts-per-request is the server's
MAX_PROMPT_CHARS = 16 << 20  # the body limit bounds it first; the context check names the real one
MAX_PROMPT_IDS = 1 << 20
PromptText = Annotated[str, Length(1, MAX_PROMPT_CHARS)]
PromptIds = Annotated[list[TOKEN_ID], Length(1, MAX_PROMPT_IDS)]
TopNum = Annotated[int, Field(ge=0, le=1024)]  # top logprobs; --max-top-logprobs is the server's
Seconds = Annotated[float, Field(gt=0, le=1e15)]  # any deadline a float holds: the request runs to its end first
Priority = Annotated[int, Field(ge=-(1 << 31), lt=1 << 31)]
CacheKey = Annotated[str, Length(1, 1024)]


class SamplingSpec(Spec):
    """SGLang's `sampling_params` (native /generate); None means the default."""

    max_new_tokens: MaxTokens | None = None
    stop: Stop | None = None
    stop_token_ids: StopTokenIds | None = None
    temperature: Temperature | None = None
    top_p: TopP | None = None
    top_k: TopK | None = None
    min_p: MinP | None = None
    frequency_penalty: Penalty | None = None
    presence_penalty: Penalty | None = None
    repetition_penalty: RepetitionPenalty | None = None
    min_new_tokens: MaxTokens | None = None
    n: Count | None = None
    json_schema: JsonSchema | None = None
    regex: Regex | None = None
    ebnf: Ebnf | None = None
    ignore_eos: bool | None = None
    skip_special_tokens: bool | None = None
    spaces_between_special_tokens: bool | None = None
    no_stop_trim: bool | None = None
    logit_bias: LogitBias | None = None
    seed: Seed | None = None
    sampling_seed: Seed | None = None
    stream_interval: Interval | None = None
    grammar_after_ids: Annotated[list[TOKEN_ID], Length(1, MAX_GRAMMAR_AFTER_IDS)] | None = None

    def as_params(self) -> dict[str, object]:
        """SamplingParams' fields that were given (sampling_seed is seed)."""
        given = self.model_dump(exclude_none=True)
        if "sampling_seed" in given and "seed" in given:
            raise InvalidRequest.field("seed", "give seed or sampling_seed, not both")
        if "sampling_seed" in given:
            given["seed"] = given.pop("sampling_seed")
        return given
