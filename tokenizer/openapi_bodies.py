"""Request-body schemas of the OpenAPI document (`tokenizer/openapi.py`), built from the tables
the validators use so that they cannot drift from them:
  - `sampling_params`: the fields of `runtime.contracts.sampling.SamplingParams` (plus `sampling_seed`),
    typed from their annotations; `SamplingParams.validate`'s ranges are `_sampling_bounds`
    (tests hold both to the validator);
  - OpenAI bodies: the fields of `protocol.COMPLETION_FIELDS` / `CHAT_FIELDS` and
    `NEUTRAL_EXTENSIONS`, sampling fields typed through `protocol.SAMPLING_FIELDS`;
  - the server's caps (`SchemaLimits`: context length within the KV pool, vocabulary, --max-n,
    --max-top-logprobs, --max-prompts-per-request) are the maxima: the bounds a client reads are
    the ones this server enforces (rules across fields, such as prompt + max_new_tokens within
    the context, are described, not encoded).
Optional fields may be JSON null ("the default"), as the validators read it, except the few
whose validators refuse null (`not_null`). Required fields (the prompt) may not.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any

from runtime.contracts.sampling import (
    MAX_GRAMMAR_AFTER_IDS,
    MAX_LOGIT_BIAS,
    MAX_LOGIT_BIAS_ENTRIES,
    MAX_STOP_STR_CHARS,
    MAX_STOP_STRS,
    MAX_STOP_TOKEN_IDS,
    SamplingParams,
)
from tokenizer.generate_body import MAX_CACHE_KEY_CHARS, MAX_RID_CHARS
from tokenizer.openai import protocol
from tokenizer.openai.messages import ROLES
from tokenizer.openai.template_vars import MAX_TEMPLATE_CHARS
from tokenizer.token_routes import MAX_DETOKENIZE_IDS

if TYPE_CHECKING:
    from tokenizer.server_state import ServerState

Schema = dict[str, Any]
INT32_MAX = 2**31 - 1
INT64_MAX = 2**63 - 1  # NOTE: orjson reads a larger JSON integer as a float, which is refused
TOOL_NAME_PATTERN = "^[A-Za-z0-9_-]{1,64}$"  # constraints._NAME
TEMPLATE_VAR_PATTERN = "^[A-Za-z_][A-Za-z0-9_]{0,63}$"  # template_vars._KEY


@dataclass(frozen=True, slots=True)
class SchemaLimits:
    """The server settings the document's bounds come from."""

    token_budget: int  # prompt + output tokens of one request (context length, within the KV pool)
    vocab_size: int
    max_n: int
    max_top_logprobs: int
    max_prompts: int
    api_key: bool

    @classmethod
    def of(cls, server: ServerState) -> SchemaLimits:
        from tokenizer.openai.api import token_budget

        tm, config = server.manager(), server.config
        return cls(token_budget=token_budget(tm), vocab_size=tm.vocab_size, max_n=config.max_n,
                   max_top_logprobs=config.max_top_logprobs,
                   max_prompts=config.max_prompts_per_request, api_key=bool(config.api_key))


def ref(name: str) -> Schema:
    return {"$ref": f"#/components/schemas/{name}"}


def nullable(schema: Schema) -> Schema:
    """`schema` or JSON null (which the validators read as "the default")."""
    if schema.get("type") == "null":
        return schema
    combined = schema.keys() & {"enum", "const", "anyOf", "oneOf"}
    if isinstance(schema.get("type"), str) and not combined:
        return {**schema, "type": [schema["type"], "null"]}
    return {"anyOf": [schema, {"type": "null"}]}


def obj(props: dict[str, Schema], required: tuple[str, ...] = (), closed: bool = False,
        not_null: tuple[str, ...] | bool = ()) -> Schema:
    """An object schema; `closed`: no other keys. Optional properties may be null, except
    `not_null` ones (True: all), whose validators read null as a wrong type."""
    keep = set(required) | (set(props) if not_null is True else set(not_null or ()))
    out: Schema = {"type": "object", "properties": {
        k: v if k in keep else nullable(v) for k, v in props.items()}}
    if required:
        out["required"] = list(required)
    if closed:
        out["additionalProperties"] = False
    return out


def integer(lo: int | None = None, hi: int | None = None) -> Schema:
    out: Schema = {"type": "integer"}
    if lo is not None:
        out["minimum"] = lo
    if hi is not None:
        out["maximum"] = hi
    return out


def string(lo: int = 0, hi: int | None = None) -> Schema:
    out: Schema = {"type": "string"}
    if lo:
        out["minLength"] = lo
    if hi is not None:
        out["maxLength"] = hi
    return out


def array(items: Schema, lo: int = 0, hi: int | None = None) -> Schema:
    out: Schema = {"type": "array", "items": items}
    if lo:
        out["minItems"] = lo
    if hi is not None:
        out["maxItems"] = hi
    return out


def _one_or_many(item: Schema, lim: SchemaLimits) -> Schema:
    """A value given once for the batch, or one per prompt."""
    return {"anyOf": [item, array(item, 1, lim.max_prompts)]}


BOOL: Schema = {"type": "boolean"}
IGNORED_FIELD: Schema = {"description": "accepted and ignored"}

# ---------------------------------------------------------------- sampling parameters

_ANNOTATIONS: dict[str, Schema] = {  # SamplingParams annotation -> its JSON type
    "int": {"type": "integer"}, "float": {"type": "number"}, "bool": BOOL,
    "int | None": {"type": "integer"}, "str | None": {"type": "string"},
}


def _sampling_bounds(lim: SchemaLimits) -> dict[str, Schema]:
    """`SamplingParams.validate`'s ranges and the server's caps, by field."""
    token_id = integer(0, lim.vocab_size - 1)
    return {
        "temperature": {"minimum": 0}, "top_p": {"exclusiveMinimum": 0, "maximum": 1},
        "min_p": {"minimum": 0, "maximum": 1},
        "frequency_penalty": {"minimum": -2, "maximum": 2},
        "presence_penalty": {"minimum": -2, "maximum": 2},
        "repetition_penalty": {"exclusiveMinimum": 0, "maximum": 2},
        # NOTE: a prompt has a token at least, so the budget less one is the exact maximum.
        "max_new_tokens": {"minimum": 0, "maximum": lim.token_budget - 1,
                           "description": "prompt + max_new_tokens must fit the context length"},
        "min_new_tokens": {"minimum": 0, "maximum": lim.token_budget - 1,
                           "description": "at most max_new_tokens"},
        "n": {"minimum": 1, "maximum": lim.max_n}, "seed": {"minimum": 0, "maximum": INT64_MAX},
        "stream_interval": {"minimum": 1, "maximum": INT64_MAX},
        "top_k": {"type": "integer", "anyOf": [{"const": -1}, {"minimum": 1, "maximum": INT64_MAX}],
                  "description": "-1: all tokens"},
        "stop": {"anyOf": [string(1, MAX_STOP_STR_CHARS),
                           array(string(1, MAX_STOP_STR_CHARS), 0, MAX_STOP_STRS)]},
        "stop_token_ids": array(token_id, 0, MAX_STOP_TOKEN_IDS),
        "grammar_after_ids": {**array(token_id, 0, MAX_GRAMMAR_AFTER_IDS),
                              "description": "the grammar constrains only what follows these ids in the output "
                                             "(the reasoning's end): 1 or more, with a grammar"},
        "logit_bias": {"type": "object", "maxProperties": MAX_LOGIT_BIAS_ENTRIES,
                       "propertyNames": {"pattern": "^[0-9]+$"},
                       "additionalProperties": {"type": "number", "minimum": -MAX_LOGIT_BIAS,
                                                "maximum": MAX_LOGIT_BIAS},
                       "description": f"token id (< {lim.vocab_size}) -> bias"},
        "json_schema": {"anyOf": [{"type": "string"}, {"type": "object"}],
                        "description": "a JSON schema (object or its text) the output must match; "
                                       "at most one of json_schema, regex, ebnf"},
    }


def sampling_properties(lim: SchemaLimits) -> dict[str, Schema]:
    """One schema per field `SamplingParams.from_dict` accepts."""
    bounds = _sampling_bounds(lim)
    props: dict[str, Schema] = {}
    for f in fields(SamplingParams):
        extra = bounds.get(f.name, {})
        whole = "anyOf" in extra or "type" in extra or "items" in extra
        base = {} if whole else dict(_ANNOTATIONS[str(f.type)])  # NOTE: a new type fails here
        props[f.name] = {**base, **extra}
    props["sampling_seed"] = {**props["seed"], "description": "SGLang's name for seed"}
    return props


# ---------------------------------------------------------------- request bodies


def generate_request(lim: SchemaLimits) -> Schema:
    """SGLang's /generate body (`tokenizer.generate_body`)."""
    ids, rid = array(integer(0, lim.vocab_size - 1), 1), string(1, MAX_RID_CHARS)
    props: dict[str, Schema] = {
        "text": {"anyOf": [string(1), array(string(1), 1, lim.max_prompts)]},
        "input_ids": {"anyOf": [ids, array(ids, 1, lim.max_prompts)]},
        "sampling_params": {"anyOf": [ref("SamplingParams"),
                                      array(ref("SamplingParams"), 1, lim.max_prompts)]},
        "rid": {"anyOf": [rid, array(rid, 1, lim.max_prompts)],
                "description": "a batch's one string rid names its prompts rid_0, rid_1, ..."},
        "return_logprob": _one_or_many(BOOL, lim),
        "logprob_start_len": _one_or_many(integer(-1, lim.token_budget - 1), lim),
        "top_logprobs_num": _one_or_many(integer(0, lim.max_top_logprobs), lim),
        "return_text_in_logprobs": BOOL, "stream": BOOL,
        "timeout": {"type": "number", "exclusiveMinimum": 0, "description": "seconds"},
        "priority": {**integer(-INT32_MAX, INT32_MAX),
                     "description": "needs --enable-priority-scheduling (a 400 without it)"},
        "extra_key": {**string(1, MAX_CACHE_KEY_CHARS), "description": "prefix-cache namespace"},
    }
    out = obj(props)
    for prompt in ("text", "input_ids"):  # exactly one, and not null
        out["properties"][prompt] = props[prompt]
    out["oneOf"] = [{"required": ["text"]}, {"required": ["input_ids"]}]
    return out


def _openai_common(lim: SchemaLimits) -> dict[str, Schema]:
    """Fields both OpenAI routes share, typed from the sampling table they map to."""
    sampling = sampling_properties(lim)
    props = {name: sampling[target] for name, target in protocol.SAMPLING_FIELDS.items()}
    props.update({g: sampling[g] for g in protocol.GRAMMAR_FIELDS})
    props.update({name: IGNORED_FIELD for name in protocol.IGNORED})
    props.update({
        "model": {"type": "string", "description": "ignored: the one served model answers"},
        "max_tokens": sampling["max_new_tokens"], "stream": BOOL,
        "stream_options": obj({"include_usage": BOOL}, closed=True, not_null=True),
        "rid": string(1, MAX_RID_CHARS),
        "timeout": {"type": "number", "exclusiveMinimum": 0, "description": "seconds"},
        "cache_salt": string(1, MAX_CACHE_KEY_CHARS), "extra_key": string(1, MAX_CACHE_KEY_CHARS),
        "priority": integer(-INT32_MAX, INT32_MAX),
    })
    return props


def _extensions() -> dict[str, Schema]:
    """SGLang's extensions: booleans, and only the values that ask for nothing we lack."""
    return {name: BOOL if ok is None else {"type": "boolean", "enum": list(ok)}
            for name, ok in protocol.NEUTRAL_EXTENSIONS.items()}


def completion_request(lim: SchemaLimits) -> Schema:
    ids = array(integer(0, lim.vocab_size - 1), 1)
    props = {**_openai_common(lim),
             "prompt": {"anyOf": [string(1), array(string(1), 1, lim.max_prompts), ids,
                                  array(ids, 1, lim.max_prompts)]},
             "logprobs": integer(0, lim.max_top_logprobs), "echo": BOOL,
             "suffix": {"type": "null", "description": "not supported"},
             "best_of": {"type": "integer", "const": 1}}
    out = obj(props, required=("prompt",), closed=True)
    out["properties"].update(_extensions())
    return out


def chat_request(lim: SchemaLimits) -> Schema:
    common = _openai_common(lim)
    choice = obj({"type": {"const": "function"}, "function": obj({"name": string()}, ("name",))},
                 ("type", "function"))
    props = {**common, "messages": array(ref("ChatMessage"), 1),
             "max_completion_tokens": common["max_tokens"], "logprobs": BOOL,
             "top_logprobs": {**integer(0, lim.max_top_logprobs), "description": "needs logprobs"},
             "response_format": _response_format(), "tools": array(_tool()),
             "tool_choice": {"anyOf": [{"type": "string", "enum": ["none", "auto", "required"]},
                                       choice]},
             "parallel_tool_calls": {**BOOL, "description": "false: at most one tool call"},
             "chat_template_kwargs": {"type": "object",
                                      "propertyNames": {"pattern": TEMPLATE_VAR_PATTERN},
                                      "description": "template variables (enable_thinking, ...)"},
             "chat_template": {**string(1, MAX_TEMPLATE_CHARS),
                               "description": "needs --trust-request-chat-template"}}
    out = obj(props, required=("messages",), closed=True)
    out["properties"].update(_extensions())
    return out


def _response_format() -> Schema:
    spec = obj({"name": string(), "strict": BOOL, "schema": {"type": "object"}}, ("schema",))
    return {"anyOf": [
        obj({"type": {"type": "string", "enum": ["text", "json_object"]}}, ("type",)),
        obj({"type": {"const": "json_schema"}, "json_schema": spec}, ("type", "json_schema")),
    ]}


def _tool() -> Schema:
    parameters = obj({"type": {"const": "object"}}, not_null=True)
    fn = obj({"name": {"type": "string", "pattern": TOOL_NAME_PATTERN}, "description": string(),
              "strict": BOOL, "parameters": parameters}, ("name",))
    return obj({"type": {"const": "function"}, "function": fn}, ("type", "function"))


def chat_message() -> Schema:
    """One message of `messages` (`tokenizer.openai.messages`): content is required but for an
    assistant's, which may be null (a message with tool_calls only). Other keys are dropped."""
    part = obj({"type": {"const": "text"}, "text": string()}, ("type", "text"))
    content = {"anyOf": [string(), array(part)]}
    arguments = {"anyOf": [string(), {"type": "object"}], "description": "JSON text or an object"}
    call = obj({"id": string(), "type": {"const": "function"},
                "function": obj({"name": string(), "arguments": arguments}, ("name",),
                                not_null=True)}, ("function",))
    roles = [r for r in ROLES if r != "assistant"]
    return {"oneOf": [
        obj({"role": {"type": "string", "enum": roles}, "content": content, "name": string(),
             "tool_call_id": string()}, ("role", "content")),
        obj({"role": {"const": "assistant"}, "content": content, "name": string(),
             "tool_calls": array(call)}, ("role",)),
    ]}


def token_requests(lim: SchemaLimits) -> dict[str, Schema]:
    """/tokenize and /detokenize (`tokenizer.token_routes`)."""
    prompt = {"anyOf": [string(), array(string(), 1, lim.max_prompts)]}
    tokens = array(integer(0, lim.vocab_size - 1), 0, MAX_DETOKENIZE_IDS)
    return {
        "TokenizeRequest": obj({"prompt": prompt, "add_special_tokens": BOOL,
                                "model": IGNORED_FIELD}, ("prompt",),
                               not_null=("add_special_tokens",)),
        "DetokenizeRequest": obj({"tokens": tokens, "skip_special_tokens": BOOL,
                                  "model": IGNORED_FIELD}, ("tokens",),
                                 not_null=("skip_special_tokens",)),
    }


def abort_request() -> Schema:
    """/abort_request (`native_api.abort_request`): a rid (a prefix), or abort_all."""
    out = obj({"rid": string(1), "abort_all": BOOL}, not_null=("abort_all",))
    out["anyOf"] = [{"required": ["rid"], "properties": {"rid": string(1)}},
                    {"required": ["abort_all"], "properties": {"abort_all": {"const": True}}}]
    return out
