"""OpenAI request validation: a /v1/completions or /v1/chat/completions body becomes a
TokenizerManager body (SGLang's /generate shape) plus what the response needs (`OpenAIPlan`).

Structure and OpenAI-only fields are checked here; sampling values go into `sampling_params`
and are checked by `SamplingParams` inside `TokenizerManager.generate`, whose errors are renamed
back to the OpenAI names by `translate`. Choices where OpenAI or SGLang leave room:
  - Unknown fields are rejected with a 400 naming them (as OpenAI does), except a few harmless
    OpenAI fields that are accepted and ignored (`IGNORED`).
  - Grammar constraints go into `sampling_params`: the extras `regex`, `json_schema`, `ebnf` as
    given, and chat's `response_format` and forced tool calls as `constraints.py` maps
    them. The manager compiles and checks them (one per request at most).
  - Chat `max_tokens` defaults to the rest of the context (OpenAI, vLLM); completions to 16.
  - A chat prompt is the chat template's text tokenized without adding special tokens (the
    template already has them), sent as `input_ids`. `check_chat` validates everything the
    template gets (`messages.py`, `template_vars.py`); the caller renders the `ChatPrompt` and
    `finish_chat` builds the plan (the server renders off the event loop: `api.plan_chat_request`).
  - Fields without a check of their own here (sampling values, `timeout`, ...) are first held to
    `FIELD_BOUNDS`, so that no later check can meet a value deep enough to break its error
    message's repr, or a number or string the tokenizer cannot take.
"""

from __future__ import annotations

import re
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeGuard

from runtime.contracts.errors import InvalidRequest
from tokenizer.chat_template import RequestTemplate
from tokenizer.generate_body import cache_namespace
from tokenizer.openai.constraints import (
    GRAMMAR_FIELDS,
    ChatConstraints,
    ToolPlan,
    chat_constraints,
)
from tokenizer.openai.json_bounds import Bounds, check_value, describe
from tokenizer.openai.messages import check_messages
from tokenizer.openai.template_vars import check_template_kwargs

SAMPLING_FIELDS = {  # OpenAI / SGLang-extra name -> SamplingParams name
    "temperature": "temperature", "top_p": "top_p", "n": "n", "stop": "stop", "seed": "seed",
    "frequency_penalty": "frequency_penalty", "presence_penalty": "presence_penalty",
    "logit_bias": "logit_bias", "top_k": "top_k", "min_p": "min_p",
    "repetition_penalty": "repetition_penalty", "min_tokens": "min_new_tokens",
    "ignore_eos": "ignore_eos", "stop_token_ids": "stop_token_ids",
    "skip_special_tokens": "skip_special_tokens", "no_stop_trim": "no_stop_trim",
    "spaces_between_special_tokens": "spaces_between_special_tokens",
}
IGNORED = {"user", "metadata", "store", "service_tier"}
# SGLang's extensions that sglang-router forwards on every request (its typed request writes them
# out with their defaults): accepted when they ask for nothing we lack, a 400 naming them when
# they do. (name -> the values that ask for nothing; None: any boolean, it changes nothing here.)
NEUTRAL_EXTENSIONS: dict[str, tuple[bool, ...] | None] = {
    "return_hidden_states": (False,),
    "continue_final_message": (False,),
    "separate_reasoning": None,  # any boolean: used with --reasoning-parser (reasoning.py)
    "stream_reasoning": None,
}
COMMON = {"model", "max_tokens", "stream", "stream_options", "logprobs", "rid", "timeout", "cache_salt", "extra_key",
          "priority",
          *SAMPLING_FIELDS, *GRAMMAR_FIELDS, *IGNORED}
COMPLETION_FIELDS = COMMON | {"prompt", "echo", "suffix", "best_of"}
CHAT_FIELDS = COMMON | {"messages", "max_completion_tokens", "top_logprobs", "response_format",
                        "tools", "tool_choice", "parallel_tool_calls", "chat_template_kwargs", "chat_template"}
# Fields whose own checks walk them (the others meet FIELD_BOUNDS first); IGNORED ones are unread.
SELF_CHECKED = {"prompt", "messages", "tools", "tool_choice", "parallel_tool_calls", "response_format",
                "chat_template_kwargs", "chat_template", *IGNORED}
FIELD_BOUNDS = Bounds(max_depth=8)
COMPLETION_DEFAULT_MAX_TOKENS = 16


@dataclass(slots=True)
class OpenAIPlan:
    """A validated OpenAI request: the manager body and the response's parameters."""

    kind: str  # "completion" | "chat"
    body: dict[str, Any]
    id: str
    created: int
    model: str
    n: int
    num_prompts: int
    stream: bool
    include_usage: bool
    logprobs: bool
    echo_texts: list[str] | None = None  # completions with echo: each prompt's text
    tools: ToolPlan | None = None  # chat with callable tools: outputs are parsed for calls
    renames: dict[str, str] = field(default_factory=dict)
    """Manager field -> request field, for a constraint built from another field (an invalid
    response_format schema is reported as response_format.json_schema.schema, not json_schema)."""
    # SGLang's extensions for a server with --reasoning-parser: split the thinking text out,
    # and stream it as it comes (False: in one delta once complete).
    separate_reasoning: bool = True
    stream_reasoning: bool = True

    @property
    def num_choices(self) -> int:
        return self.n * self.num_prompts


def translate(exc: InvalidRequest, kind: str,
              renames: dict[str, str] | None = None) -> InvalidRequest:
    """The manager's field names in an error, renamed to the OpenAI request's (`renames`: the
    request's own, for the param only)."""
    names = {"max_new_tokens": "max_tokens", "min_new_tokens": "min_tokens",
             "top_logprobs_num": "top_logprobs" if kind == "chat" else "logprobs",
             "text": "prompt" if kind == "completion" else "messages",
             "input_ids": "prompt" if kind == "completion" else "messages",
             "sampling_seed": "seed"}
    pattern = re.compile(r"\b(" + "|".join(names) + r")\b")
    message = pattern.sub(lambda m: names[m.group(1)], exc.message)
    if exc.param is None:
        return InvalidRequest(message)
    key = exc.param.removeprefix("sampling_params.")  # OpenAI bodies have no such nesting
    return InvalidRequest(message, param=(renames or {}).get(key) or names.get(key, key))


# ---------------------------------------------------------------- field helpers


def _typed(req: dict[str, Any], name: str, ok: Callable[[Any], bool], what: str) -> Any:
    value = req.get(name)
    if value is not None and not ok(value):
        raise InvalidRequest(f"{name} must be {what}, got {type(value).__name__}", param=name)
    return value


def _is_int(x: Any) -> TypeGuard[int]:
    return isinstance(x, int) and not isinstance(x, bool)


def _check_object(req: Any, allowed: set[str]) -> dict[str, Any]:
    if not isinstance(req, dict):
        raise InvalidRequest("the request body must be a JSON object")
    for name, neutral in NEUTRAL_EXTENSIONS.items():
        if name in req:
            value = req[name]
            if not isinstance(value, bool) or (neutral is not None and value not in neutral):
                raise InvalidRequest(f"{name}={describe(value)} is not supported", param=name)
    unknown = sorted(k for k in req if k not in allowed and k not in NEUTRAL_EXTENSIONS)
    if unknown:
        raise InvalidRequest(f"Unrecognized request argument(s): {', '.join(unknown)}",
                             param=unknown[0])
    for name, value in req.items():
        if name not in SELF_CHECKED:
            check_value(value, name, FIELD_BOUNDS)
    _typed(req, "model", lambda x: isinstance(x, str), "a string")
    return req


def _sampling(req: dict[str, Any], max_tokens: Any) -> dict[str, Any]:
    params = {SAMPLING_FIELDS[k]: v for k, v in req.items()
              if k in SAMPLING_FIELDS and v is not None}
    params.update({k: req[k] for k in GRAMMAR_FIELDS if req.get(k) is not None})
    params["max_new_tokens"] = max_tokens
    return params


def _stream_options(req: dict[str, Any]) -> tuple[bool, bool]:
    """(stream, include_usage)."""
    stream = bool(_typed(req, "stream", lambda x: isinstance(x, bool), "a boolean"))
    options = _typed(req, "stream_options", lambda x: isinstance(x, dict), "an object")
    if options is None:
        return stream, False
    if not stream:
        raise InvalidRequest("stream_options is only allowed when stream is true",
                             param="stream_options")
    unknown = sorted(k for k in options if k != "include_usage")
    if unknown:
        raise InvalidRequest(f"unknown stream_options field {describe(unknown[0])}",
                             param="stream_options")
    usage = options.get("include_usage", False)
    if not isinstance(usage, bool):
        raise InvalidRequest("stream_options.include_usage must be a boolean",
                             param="stream_options.include_usage")
    return stream, usage


def _top_k(req: dict[str, Any], name: str, cap: int) -> int | None:
    value = _typed(req, name, _is_int, "an integer")
    if value is not None and not 0 <= value <= cap:
        raise InvalidRequest(f"{name} must be in [0, {cap}], got {value}", param=name)
    return value


def _plan(kind: str, req: dict[str, Any], model: str, **fields: Any) -> OpenAIPlan:
    rid = _typed(req, "rid", lambda x: isinstance(x, str) and x != "", "a non-empty string")
    rid = rid or uuid.uuid4().hex
    fields["body"]["rid"] = rid
    if req.get("timeout") is not None:  # checked with the native body's (seconds > 0)
        fields["body"]["timeout"] = req["timeout"]
    if req.get("priority") is not None:  # checked with the native body's
        fields["body"]["priority"] = req["priority"]
    namespace = cache_key(req)
    if namespace is not None:
        fields["body"]["extra_key"] = namespace
    n_value = req.get("n")
    n = n_value if _is_int(n_value) else 1
    prefix = "cmpl-" if kind == "completion" else "chatcmpl-"
    return OpenAIPlan(kind=kind, id=prefix + rid, created=int(time.time()), model=model, n=n,
                      **fields)


def cache_key(req: dict[str, Any]) -> str | None:
    """The prefix-cache namespace of an OpenAI request: vLLM's `cache_salt` or SGLang's
    `extra_key` (the same namespace as the native body's `extra_key`); both given, joined by a
    NUL so that ("a", "bc") and ("ab", "c") stay apart."""
    parts = [cache_namespace(req.get(name), name) for name in ("cache_salt", "extra_key")]
    given = [p for p in parts if p is not None]
    return "\x00".join(given) if given else None


# ---------------------------------------------------------------- completions


def plan_completion(req: Any, model: str, max_top_logprobs: int,
                    decode: Callable[[list[int]], str]) -> OpenAIPlan:
    """/v1/completions -> manager body. `decode` turns id prompts into text for `echo`, in the
    caller's thread (the server decodes off the event loop: `api.plan_completion_request`)."""
    plan, echo = check_completion(req, model, max_top_logprobs)
    if echo is not None:
        plan.echo_texts = [p if isinstance(p, str) else decode(p) for p in echo]
    return plan


def check_completion(req: Any, model: str, max_top_logprobs: int) -> tuple[OpenAIPlan, list[Any] | None]:
    """/v1/completions -> (its plan without `echo_texts`, the prompts to echo: strings or id lists,
    None without `echo`)."""
    req = _check_object(req, COMPLETION_FIELDS)
    prompts, field, is_batch = _prompts(req.get("prompt"))
    if req.get("suffix") is not None:
        raise InvalidRequest("suffix is not supported", param="suffix")
    if req.get("best_of") not in (None, 1):
        raise InvalidRequest("best_of is not supported (only 1)", param="best_of")
    echo = bool(_typed(req, "echo", lambda x: isinstance(x, bool), "a boolean"))
    logprobs = _top_k(req, "logprobs", max_top_logprobs)
    stream, include_usage = _stream_options(req)
    max_tokens = req.get("max_tokens")
    body: dict[str, Any] = {
        field: prompts if is_batch else prompts[0],
        "sampling_params": _sampling(req, COMPLETION_DEFAULT_MAX_TOKENS if max_tokens is None
                                     else max_tokens),
        "stream": stream,
    }
    if logprobs is not None:
        body.update(return_logprob=True, top_logprobs_num=logprobs, return_text_in_logprobs=True,
                    logprob_start_len=0 if echo else -1)
    plan = _plan("completion", req, model, body=body, num_prompts=len(prompts), stream=stream,
                 include_usage=include_usage, logprobs=logprobs is not None)
    return plan, (prompts if echo else None)


def _prompts(prompt: Any) -> tuple[list[Any], str, bool]:
    """(the prompts of a completions request, the manager field they go to, is_batch)."""
    if isinstance(prompt, str):
        if not prompt:
            raise InvalidRequest("prompt must not be empty", param="prompt")
        return [prompt], "text", False
    if not isinstance(prompt, list) or not prompt:
        raise InvalidRequest("prompt must be a non-empty string, list of strings, list of token "
                             "ids or list of token id lists", param="prompt")
    if all(isinstance(p, str) for p in prompt):
        if not all(prompt):
            raise InvalidRequest("prompt strings must not be empty", param="prompt")
        return prompt, "text", True
    if all(_is_int(t) for t in prompt):
        return [prompt], "input_ids", False
    if all(isinstance(p, list) and p and all(_is_int(t) for t in p) for p in prompt):
        return prompt, "input_ids", True
    raise InvalidRequest("prompt must be a string, a list of strings, a list of token ids or a "
                         "list of non-empty token id lists (not a mix)", param="prompt")


# ---------------------------------------------------------------- chat


@dataclass(frozen=True, slots=True)
class ChatPrompt:
    """What the chat template renders: validated messages, the template's variables, the
    callable tools (OpenAI's shape) and a request's own template (only with
    --trust-request-chat-template)."""

    messages: list[dict[str, Any]]
    variables: dict[str, Any]
    tools: list[dict[str, Any]] | None = None
    template: RequestTemplate | None = None

    def template_kwargs(self) -> dict[str, Any]:
        """Keywords for a tokenizer's `apply_chat_template`: the variables, `tools` and
        `chat_template` when given."""
        kwargs = dict(self.variables)
        if self.tools is not None:
            kwargs["tools"] = self.tools
        if self.template is not None:
            kwargs["chat_template"] = self.template.source
        return kwargs


@dataclass(slots=True)
class CheckedChat:
    """A validated chat request before rendering: its prompt and what its plan needs."""

    req: dict[str, Any]
    prompt: ChatPrompt
    constraints: ChatConstraints
    logprobs: bool
    top_logprobs: int | None
    stream: bool
    include_usage: bool


def check_chat(req: Any, max_top_logprobs: int, trust_template: bool = False) -> CheckedChat:
    """Validate a /v1/chat/completions body (everything but what needs the rendered prompt).
    `trust_template`: the server's --trust-request-chat-template."""
    req = _check_object(req, CHAT_FIELDS)
    messages = check_messages(req.get("messages"))
    constraints = chat_constraints(req)
    logprobs = bool(_typed(req, "logprobs", lambda x: isinstance(x, bool), "a boolean"))
    top = _top_k(req, "top_logprobs", max_top_logprobs)
    if top and not logprobs:
        raise InvalidRequest("top_logprobs requires logprobs to be true", param="top_logprobs")
    stream, include_usage = _stream_options(req)
    variables, template = check_template_kwargs(req, trust_template)
    tools = constraints.tools.as_openai_tools() if constraints.tools is not None else None
    prompt = ChatPrompt(messages, variables, tools, template)
    return CheckedChat(req, prompt, constraints, logprobs, top, stream, include_usage)


def finish_chat(chat: CheckedChat, model: str, context_length: int, ids: list[int]) -> OpenAIPlan:
    """The plan of a checked chat request whose prompt rendered to `ids`."""
    req = chat.req
    max_tokens = req.get("max_completion_tokens")
    if max_tokens is None:
        max_tokens = req.get("max_tokens")
    if max_tokens is None:
        max_tokens = max(context_length - len(ids), 0)
    sampling = {**_sampling(req, max_tokens), **chat.constraints.grammar}
    body: dict[str, Any] = {"input_ids": ids, "sampling_params": sampling, "stream": chat.stream}
    if chat.logprobs:
        body.update(return_logprob=True, top_logprobs_num=chat.top_logprobs or 0,
                    return_text_in_logprobs=True)
    return _plan("chat", req, model, body=body, num_prompts=1, stream=chat.stream,
                 include_usage=chat.include_usage, logprobs=chat.logprobs,
                 tools=chat.constraints.tools, renames=chat.constraints.renames,
                 separate_reasoning=req.get("separate_reasoning", True),
                 stream_reasoning=req.get("stream_reasoning", True))


def plan_chat(req: Any, model: str, max_top_logprobs: int, context_length: int,
              render: Callable[[list[dict[str, Any]], dict[str, Any]], list[int]],
              trust_template: bool = False) -> OpenAIPlan:
    """/v1/chat/completions -> manager body, rendering in the caller's thread.
    `render(messages, template_kwargs)` applies the chat template and tokenizes (raising
    InvalidRequest when the template refuses); `template_kwargs` is
    `ChatPrompt.template_kwargs()`."""
    chat = check_chat(req, max_top_logprobs, trust_template)
    ids = render(chat.prompt.messages, chat.prompt.template_kwargs())
    return finish_chat(chat, model, context_length, ids)
