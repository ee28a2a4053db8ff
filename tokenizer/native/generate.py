"""SGLang's /generate: its body parsed into the typed request, and its answers folded from the
event stream in SGLang's shapes.

    {"text": cumulative text, "output_ids": cumulative ids,
     "meta_info": {id, finish_reason, prompt_tokens, completion_tokens, cached_tokens, e2e_latency,
                   [input|output]_token_logprobs, [input|output]_top_logprobs}}

One prompt with n=1 answers one such object (and streams cumulative chunks of it, as SGLang's
frontend expects); a batch or n>1 answers a list, and streams chunks tagged with "index"
(prompt-major: i * n + j).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any

from runtime.contracts.errors import InvalidRequest
from tokenizer.core.events import Finished, InputLogprobs, LogprobEntry, TextDelta, Tokens, TopLogprobs, Update
from tokenizer.core.fields import SamplingSpec
from tokenizer.core.request import GenRequest, Logprobs, PromptRequest
from tokenizer.core.spec import BRACKETS, parse
from tokenizer.errors import error_body
from tokenizer.native.spec import GenerateBody

# The runtime's checks name SamplingParams' fields; here they sit in sampling_params.
ERROR_NAMES = {name: f"sampling_params.{name}" for name in SamplingSpec.model_fields} | {
    "sampling_seed": "sampling_params.seed"}


def parse_generate(raw: Any, owner: str = "") -> GenRequest:
    """A /generate body as the typed request (InvalidRequest naming the field)."""
    body = parse(GenerateBody, raw, BRACKETS)
    prompts, field_name, batch = _prompts(body)
    n = len(prompts)
    rids = _rids(body.rid, n, batch)
    params = _per_prompt(body.sampling_params, n, "sampling_params")
    enabled = _per_prompt(body.return_logprob, n, "return_logprob")
    starts = _per_prompt(body.logprob_start_len, n, "logprob_start_len")
    tops = _per_prompt(body.top_logprobs_num, n, "top_logprobs_num")
    requests = [
        PromptRequest(prompts[i], rids[i], _sampling(params[i]),
                      Logprobs(bool(enabled[i]), -1 if starts[i] is None else starts[i], tops[i] or 0,
                               bool(body.return_text_in_logprobs)), field_name)
        for i in range(n)
    ]
    group = body.rid if batch and isinstance(body.rid, str) else None
    return GenRequest(requests, stream=bool(body.stream), batch=batch, group_rid=group, timeout=body.timeout,
                      priority=body.priority, cache_namespace=body.extra_key, owner=owner, names=ERROR_NAMES)


def _prompts(body: GenerateBody) -> tuple[list[str | list[int]], str, bool]:
    """(prompts, the field they came from, whether the body gave a list of them)."""
    if (body.text is None) == (body.input_ids is None):
        raise InvalidRequest.field("text", "give exactly one of text or input_ids")
    if body.text is not None:
        texts = body.text if isinstance(body.text, list) else [body.text]
        return list(texts), "text", isinstance(body.text, list)
    ids = body.input_ids
    assert ids is not None
    if ids and isinstance(ids[0], list):
        return [list(p) for p in ids if isinstance(p, list)], "input_ids", True
    return [[int(t) for t in ids if isinstance(t, int)]], "input_ids", False


def _rids(rid: str | list[str] | None, n: int, batch: bool) -> list[str]:
    if rid is None:
        return [uuid.uuid4().hex for _ in range(n)]
    if isinstance(rid, str):
        return [f"{rid}_{i}" for i in range(n)] if batch else [rid]
    if len(rid) != n:
        raise InvalidRequest.field("rid", f"has {len(rid)} entries for {n} prompts")
    if len(set(rid)) != n:
        raise InvalidRequest.field("rid", "entries must be unique")
    return list(rid)


def _per_prompt(value: Any, n: int, name: str) -> list[Any]:
    """A field given once for every prompt, or as a list of one value per prompt."""
    if not isinstance(value, list):
        return [value] * n
    if len(value) != n:
        raise InvalidRequest.field(name, f"has {len(value)} entries for {n} prompts")
    return value


def _sampling(spec: SamplingSpec | None) -> dict[str, Any]:
    return {} if spec is None else spec.as_params()


# ---------------------------------------------------------------- answers


@dataclass(slots=True)
class _Choice:
    """What one choice has said so far, in SGLang's cumulative form."""

    pieces: list[str] = field(default_factory=list)
    ids: list[int] = field(default_factory=list)
    logprobs: list[LogprobEntry] = field(default_factory=list)
    tops: TopLogprobs = field(default_factory=list)
    input: list[LogprobEntry] = field(default_factory=list)
    input_tops: TopLogprobs | None = None
    meta: dict[str, Any] = field(default_factory=dict)


class NativeAnswer:
    """/generate's answers folded from the events; see the module docstring."""

    named, done = False, b"data: [DONE]\n\n"

    def __init__(self, req: GenRequest) -> None:
        self.stream = req.stream
        self.fan_out = req.batch or req.n > 1
        self.logprobs = req.prompts[0].logprobs
        n = req.n
        labels = [p.rid if n == 1 else f"{p.rid}_{j}" for p in req.prompts for j in range(n)]
        self.choices = [_Choice(meta={"id": label}) for label in labels]

    def start(self) -> list[Any]:
        return []

    def update(self, update: Update) -> list[Any]:
        """The chunk of one update: the choice's output so far."""
        choice = self.choices[update.choice]
        for event in update.events:
            self._apply(choice, event)
        out = self.output(update.choice)
        return [{**out, "index": update.choice} if self.fan_out else out]

    def _apply(self, choice: _Choice, event: Any) -> None:
        if isinstance(event, TextDelta):
            choice.pieces.append(event.text)
        elif isinstance(event, Tokens):
            choice.ids.extend(event.ids)
            choice.logprobs.extend(event.logprobs or [])
            choice.tops.extend(event.top or [])
            choice.meta.update(prompt_tokens=event.usage.prompt_tokens, cached_tokens=event.usage.cached_tokens,
                               completion_tokens=event.usage.completion_tokens)
        elif isinstance(event, InputLogprobs):
            choice.input, choice.input_tops = event.entries, event.top
        elif isinstance(event, Finished):
            choice.meta.update(id=event.label, finish_reason=event.detail, e2e_latency=event.latency)

    def output(self, i: int) -> dict[str, Any]:
        choice = self.choices[i]
        meta: dict[str, Any] = {"id": "", "finish_reason": None, **choice.meta}
        if self.logprobs.enabled:
            with_tops = self.logprobs.top_n > 0
            meta.update(input_token_logprobs=choice.input, output_token_logprobs=choice.logprobs,
                        input_top_logprobs=(choice.input_tops or []) if with_tops else None,
                        output_top_logprobs=choice.tops if with_tops else None)
        text = "".join(choice.pieces)
        choice.pieces[:] = [text]
        return {"text": text, "output_ids": choice.ids, "meta_info": meta}

    def error_events(self, status: int, message: str, param: str | None) -> list[Any]:
        return [error_body(status, message, param)]

    def end(self) -> list[Any]:
        return []

    def final(self) -> Any:
        outs = [self.output(i) for i in range(len(self.choices))]
        return outs if self.fan_out else outs[0]
