"""/v1/completions: the body parsed into the typed request, and the answer (`text_completion`
objects and chunks) folded from the event stream.

`max_tokens` defaults to 16, as OpenAI's; `echo` prepends each prompt's text (decoded when the
prompt is ids) and, with `logprobs`, its input logprobs; `suffix` and `best_of` other than 1 are
not supported. Choice `index` is prompt-major (`prompt * n + sample`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from runtime.contracts.errors import InvalidRequest
from tokenizer.core.events import Finished, InputLogprobs, LogprobEntry, TextDelta, Tokens, TopLogprobs, Update, Usage
from tokenizer.core.request import GenRequest, Logprobs, PromptRequest
from tokenizer.core.spec import BRACKETS, parse
from tokenizer.openai.common import (
    ERROR_NAMES,
    Header,
    OpenAIAnswer,
    cache_namespace,
    include_usage,
    new_rid,
    sampling_fields,
)
from tokenizer.openai.spec import CompletionBody

DEFAULT_MAX_TOKENS = 16


@dataclass(slots=True)
class CompletionRequest:
    """A parsed completions body; `echo` holds the prompts to echo (texts, or ids to decode)."""

    req: GenRequest
    header: Header
    echo: list[str | list[int]] | None
    include_usage: bool
    echo_texts: list[str] = field(default_factory=list)


def parse_completion(raw: Any, model: str, owner: str = "") -> CompletionRequest:
    """A /v1/completions body (InvalidRequest naming the field)."""
    body = parse(CompletionBody, raw, BRACKETS)
    if body.stream_options is not None and not body.stream:
        raise InvalidRequest.field("stream_options", "is only allowed when stream is true")
    prompts, batch = _prompts(body.prompt)
    rid = new_rid(body)
    max_tokens = DEFAULT_MAX_TOKENS if body.max_tokens is None else body.max_tokens
    sampling = sampling_fields(body, max_tokens)
    top = body.logprobs
    logprobs = Logprobs(top is not None, 0 if body.echo and top is not None else -1, top or 0, True)
    labels = [f"{rid}_{i}" for i in range(len(prompts))] if batch else [rid]
    requests = [PromptRequest(p, label, sampling, logprobs, "prompt") for p, label in zip(prompts, labels)]
    names = {**ERROR_NAMES, "top_logprobs_num": "logprobs", "input_ids": "prompt", "text": "prompt"}
    req = GenRequest(requests, stream=bool(body.stream), batch=batch, group_rid=rid if batch else None,
                     timeout=body.timeout, priority=body.priority, cache_namespace=cache_namespace(body),
                     owner=owner, names=names)
    return CompletionRequest(req, Header.new("cmpl-", rid, model), list(prompts) if body.echo else None,
                             include_usage(body))


def _prompts(prompt: Any) -> tuple[list[str | list[int]], bool]:
    """(the prompts, whether the body gave a list of them)."""
    if isinstance(prompt, str):
        return [prompt], False
    if prompt and isinstance(prompt[0], int):
        return [list(prompt)], False
    return list(prompt), True


# ---------------------------------------------------------------- answers


@dataclass(slots=True)
class _Choice:
    pieces: list[str] = field(default_factory=list)
    entries: list[LogprobEntry] = field(default_factory=list)
    tops: TopLogprobs = field(default_factory=list)
    offset: int = 0  # characters covered by the logprob tokens sent
    started: bool = False
    usage: Usage | None = None
    finished: Finished | None = None


class CompletionAnswer(OpenAIAnswer):
    """The answer of one completions request, folded from its events (streamed or not)."""

    chunk_object = "text_completion"

    def __init__(self, completion: CompletionRequest) -> None:
        super().__init__(completion.header, completion.req, completion.include_usage)
        self.completion = completion
        self.logprobs = completion.req.prompts[0].logprobs.enabled
        self.choices: list[_Choice] = [_Choice() for _ in range(completion.req.choices)]

    def _echo(self, i: int) -> str:
        texts = self.completion.echo_texts
        return texts[i // self.n] if texts else ""

    def start(self) -> list[Any]:
        return []

    def update(self, update: Update) -> list[Any]:
        i, choice = update.choice, self.choices[update.choice]
        text = ""
        entries: list[LogprobEntry] = []
        tops: TopLogprobs = []
        first = not choice.started
        choice.started = True
        for event in update.events:
            if isinstance(event, InputLogprobs) and self._echo(i):
                entries, tops = list(event.entries) + entries, list(event.top or []) + tops
            elif isinstance(event, TextDelta):
                text += event.text
            elif isinstance(event, Tokens):
                choice.usage = event.usage
                entries += event.logprobs or []
                tops += event.top or []
            elif isinstance(event, Finished):
                choice.finished = event
        choice.pieces.append(text)
        choice.entries += entries
        choice.tops += tops
        echo = self._echo(i) if first else ""
        logprobs = None
        if self.logprobs:
            logprobs = completion_logprobs(entries, tops, choice.offset)
            choice.offset += sum(len(t) for t in logprobs["tokens"])
        reason = choice.finished.reason if choice.finished is not None else None
        if not (text or entries or reason or echo):
            return []
        return [{**self.header.of("text_completion"),
                 "choices": [{"index": i, "text": echo + text, "logprobs": logprobs, "finish_reason": reason}]}]

    def final(self) -> dict[str, Any]:
        choices = []
        for i, c in enumerate(self.choices):
            logprobs = completion_logprobs(c.entries, c.tops, 0) if self.logprobs else None
            finished = c.finished
            choices.append({"index": i, "text": self._echo(i) + "".join(c.pieces), "logprobs": logprobs,
                            "finish_reason": finished.reason if finished else None,
                            "matched_stop": finished.matched if finished else None})
        return {**self.header.of("text_completion"), "choices": choices, "usage": self.usage()}


def completion_logprobs(entries: list[LogprobEntry], tops: TopLogprobs | None, offset: int) -> dict[str, Any]:
    """The legacy completions logprobs object; `text_offset` counts from `offset`."""
    tokens = [e[2] or "" for e in entries]
    offsets = []
    for token in tokens:
        offsets.append(offset)
        offset += len(token)
    top = None
    if tops:
        top = [None if pos is None else {t[2] or "": t[0] for t in pos} for pos in tops]
    return {"tokens": tokens, "token_logprobs": [e[0] for e in entries], "top_logprobs": top, "text_offset": offsets}
