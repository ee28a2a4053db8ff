"""The one typed request every protocol's body is parsed into (`GenRequest`), and what the core
needs to run it: its prompts (text, token ids, or a chat to render), sampling, logprobs, stream
options, how to read its output (reasoning, tools) and who asks (labels, owner, cache namespace).

    req = adapter.parse(body)            # per protocol: tokenizer/<protocol>/
    async for event in run(server, req): # tokenizer/core/pipeline.py
        ...

Plain data (no tokenizer, no sockets): the manager tokenizes and checks it against the model's
limits, the pipeline renders chats and folds outputs into events.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tokenizer.core.chat_template import RequestTemplate
from tokenizer.core.reasoning import ReasoningFormat
from tokenizer.core.tools import ToolPlan


@dataclass(frozen=True, slots=True)
class ChatInput:
    """A conversation the chat template renders: plain messages ({role, content[, tool_calls]
    [, tool_call_id]}), template variables, the callable tools, and a request's own template
    (only with --trust-request-chat-template)."""

    messages: list[dict[str, Any]]
    variables: dict[str, Any] = field(default_factory=dict)
    tools: ToolPlan | None = None
    template: RequestTemplate | None = None

    def chars(self) -> int:
        """About how many characters the messages hold (which lane renders them)."""
        return sum(len(m["content"]) if isinstance(m.get("content"), str) else 64 for m in self.messages)


Prompt = str | list[int] | ChatInput  # text (encoded with special tokens), ids, or a chat


@dataclass(frozen=True, slots=True)
class Logprobs:
    """Which logprobs a prompt's answer carries (SGLang's fields)."""

    enabled: bool = False
    start_len: int = -1  # -1: output logprobs only; k >= 0: input logprobs from position k
    top_n: int = 0
    with_text: bool = False  # each entry's token text


@dataclass(frozen=True, slots=True)
class CachePin:
    """Keep the prompt's leading tokens in the prefix cache for `ttl_s` seconds once computed
    (Anthropic's `cache_control`). Like a chat prompt, `upto` is a chat until the pipeline renders
    it: the conversation cut right after the block that ends the pinned part; then the number of
    leading prompt tokens its rendering shares with the whole prompt's."""

    ttl_s: float
    upto: ChatInput | int

    def fields(self, prompt_len: int) -> tuple[int, float]:
        """GenerateReq's (pin_prefix_len, pin_ttl_s): (0, 0.0) when nothing is pinned."""
        assert isinstance(self.upto, int), "the pipeline renders a pin's chat before submitting"
        length = min(self.upto, prompt_len)
        return (length, self.ttl_s) if length > 0 else (0, 0.0)


@dataclass(frozen=True, slots=True)
class PromptRequest:
    """One prompt and how to sample it. `rid` is the client's label (the answer's id and a name
    /abort_request accepts); `sampling` holds SamplingParams' fields by their names."""

    prompt: Prompt
    rid: str
    sampling: dict[str, Any]
    logprobs: Logprobs = Logprobs()
    field: str = "text"  # the body field the prompt came from, for errors
    pin: CachePin | None = None


@dataclass(frozen=True, slots=True)
class ReadOptions:
    """How a choice's output text is read into events: thinking split out, tool calls parsed."""

    reasoning: ReasoningFormat | None = None
    stream_reasoning: bool = True
    tools: ToolPlan | None = None
    tool_parser: str = "auto"
    call_id_prefix: str = "call_"  # Anthropic's calls are toolu_...


@dataclass(frozen=True, slots=True)
class GenRequest:
    """A generation request of any protocol; see the module docstring.

    Choices are numbered prompt-major (`prompt * n + sample`). `names` maps the manager's field
    names (max_new_tokens, ...) to this protocol's, for the errors the manager raises after
    parsing (context fit, sampling ranges, grammars)."""

    prompts: list[PromptRequest]
    stream: bool = False
    batch: bool = False  # the body gave a list of prompts
    group_rid: str | None = None  # a batch's one rid, which aborts every prompt of it
    timeout: float | None = None
    priority: int | None = None
    cache_namespace: str | None = None
    owner: str = ""
    read: ReadOptions = ReadOptions()
    names: dict[str, str] = field(default_factory=dict)
    default_max_tokens: bool = False  # max_new_tokens fills the context (chat without max_tokens)
    embed: bool = False  # each prompt's pooled hidden state, no tokens (max_new_tokens 0)

    @property
    def n(self) -> int:
        return int(self.prompts[0].sampling.get("n") or 1)

    @property
    def choices(self) -> int:
        return self.n * len(self.prompts)
