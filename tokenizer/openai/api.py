"""OpenAI responses: completions and chat bodies, their stream chunks, logprobs and usage, built
from the TokenizerManager's SGLang-shaped outputs (request validation: `protocol.py`).

The manager's streamed outputs carry cumulative `text` (and cumulative logprob lists); a renderer
remembers, per choice index, how much it already sent and emits only the new part, so the joined
deltas equal the non-streamed text. Choice `index` is prompt-major (`prompt * n + sample`), as the
manager numbers fanned-out outputs. `finish_reason` is the manager's type: stop, length or abort;
or tool_calls when a chat with tools stopped after producing calls (`tool_calls.py` reads them;
a stream sends a call's id, type and name once the call is certain, then its arguments in
fragments as they are generated, and holds back only content that may still become a call).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from runtime.contracts.errors import InvalidRequest
from tokenizer.chat_template import render_chat
from tokenizer.limits import check_prompt_count, check_prompt_ids
from tokenizer.openai.constraints import GRAMMAR_FIELDS
from tokenizer.openai.protocol import (
    ChatPrompt,
    OpenAIPlan,
    check_chat,
    check_completion,
    finish_chat,
    translate,
)
from tokenizer.openai.reasoning import PARSERS as REASONING_PARSERS
from tokenizer.openai.reasoning import ReasoningFormat, ReasoningStream, opens_in_reasoning, split_reasoning
from tokenizer.openai.tool_calls import (
    ContentDelta,
    ToolCallStream,
    chat_delta,
    parse_for_plan,
)
from tokenizer.openai.tool_prompts import adapt_to_template

if TYPE_CHECKING:
    from runtime.contracts.config import ServerConfig
    from tokenizer.manager import TokenizerManager

LogprobEntry = list[Any]  # [logprob | None, token_id, text | None]


def token_budget(tm: TokenizerManager) -> int:
    """Prompt + output tokens one request may use: chat's default max_tokens fills it. NOTE:
    never past the KV pool, or the scheduler would refuse the request outright."""
    pool = tm.scheduler_info.get("max_total_tokens") or tm.context_length
    return int(min(tm.context_length, pool))


async def plan_chat_request(tm: TokenizerManager, config: ServerConfig, req: Any,
                            model: str) -> OpenAIPlan:
    """/v1/chat/completions -> plan: checked, then rendered and tokenized off the event loop.
    Under --reasoning-parser, a grammar waits for the reasoning's end (`grammar_after`)."""
    chat = check_chat(req, config.max_top_logprobs, config.trust_request_chat_template)
    prompt = await render_prompt(tm, chat.prompt)
    plan = finish_chat(chat, model, token_budget(tm), prompt.ids)
    fmt = REASONING_PARSERS.get(config.reasoning_parser) if plan.separate_reasoning else None
    sampling = plan.body["sampling_params"]
    if fmt is not None and grammar_after(fmt, sampling, prompt):
        marker = await tm.encoder.encode_texts([fmt.end], add_special_tokens=False)
        sampling["grammar_after_ids"] = list(marker[0])
    return plan


def grammar_after(fmt: ReasoningFormat, sampling: dict[str, Any], prompt: RenderedPrompt) -> bool:
    """Should the request's grammar start after the reasoning's end? Only when it has one and
    its output begins inside the reasoning block (`reasoning.opens_in_reasoning`)."""
    if all(sampling.get(g) is None for g in GRAMMAR_FIELDS):
        return False
    return opens_in_reasoning(fmt, prompt.text, prompt.template)


async def plan_completion_request(tm: TokenizerManager, config: ServerConfig, req: Any,
                                  model: str) -> OpenAIPlan:
    """/v1/completions -> plan; `echo` of id prompts decodes them, off the event loop when long."""
    plan, echo = check_completion(req, model, config.max_top_logprobs)
    if echo is not None:
        id_prompts = [p for p in echo if not isinstance(p, str)]
        _check_echo_ids(tm, config, id_prompts)
        texts = iter(await tm.encoder.decode(id_prompts))
        plan.echo_texts = [p if isinstance(p, str) else next(texts) for p in echo]
    return plan


def _check_echo_ids(tm: TokenizerManager, config: ServerConfig, prompts: list[list[int]]) -> None:
    """NOTE: echo decodes before the manager checks the prompts, so its bounds come first here:
    what the manager would refuse anyway (more prompts than --max-prompts-per-request, one longer
    than the context, an id outside the vocabulary, which the tokenizer cannot decode), worded as
    the manager words them. At most max_prompts_per_request x context_length ids are decoded."""
    check_prompt_count(len(prompts), config.max_prompts_per_request, "prompt")
    for ids in prompts:
        if ids and min(ids) < 0:  # the tokenizer cannot decode it (the manager never sees one)
            raise InvalidRequest(f"prompt: token id {min(ids)} is outside [0, {tm.vocab_size})", param="prompt")
        check_prompt_ids("prompt", ids, tm.vocab_size, tm.context_length)


@dataclass(frozen=True, slots=True)
class RenderedPrompt:
    """A chat prompt as the template rendered it, its token ids and the template's source."""

    text: str
    ids: list[int]
    template: str


async def chat_prompt_ids(tm: TokenizerManager, prompt: ChatPrompt) -> list[int]:
    """The chat template's prompt, tokenized without adding special tokens (it has them)."""
    return (await render_prompt(tm, prompt)).ids


async def render_prompt(tm: TokenizerManager, prompt: ChatPrompt) -> RenderedPrompt:
    """The chat template's prompt, and its ids (tokenized without adding special tokens)."""
    template = prompt.template
    source = template.source if template is not None else template_source(tm)
    kwargs = {**prompt.variables, "tools": prompt.tools} if prompt.tools else dict(prompt.variables)
    messages, kwargs = adapt_to_template(source, prompt.messages, kwargs)
    tools = kwargs.pop("tools", None)
    text = await render_chat(tm, messages, tools, kwargs, template)
    ids = await tm.encoder.encode_texts([text], add_special_tokens=False)
    return RenderedPrompt(text, list(ids[0]), source)


def template_source(tm: TokenizerManager) -> str:
    """The chat template's Jinja source ("" when the tokenizer has none)."""
    template = getattr(tm.tokenizer, "chat_template", None)
    if isinstance(template, dict):  # named templates: any of them may be used
        return "\n".join(str(t) for t in template.values())
    return template if isinstance(template, str) else ""


def models_list(model_name: str, created: int, context_length: int | None) -> dict[str, Any]:
    """/v1/models: the one served model."""
    card = {"id": model_name, "object": "model", "created": created, "owned_by": "radixserve",
            "root": model_name, "max_model_len": context_length}
    return {"object": "list", "data": [card]}


def finish_reason(meta: dict[str, Any]) -> str | None:
    reason = meta.get("finish_reason")
    return None if reason is None else str(reason.get("type"))


def usage(metas: list[dict[str, Any]], n: int) -> dict[str, Any]:
    """Prompt and cached tokens count once per prompt (the first of its n samples)."""
    firsts = metas[::n]
    prompt = sum(m["prompt_tokens"] for m in firsts)
    completion = sum(m["completion_tokens"] for m in metas)
    cached = sum(m["cached_tokens"] for m in firsts)
    return {"prompt_tokens": prompt, "completion_tokens": completion,
            "total_tokens": prompt + completion, "prompt_tokens_details": {"cached_tokens": cached}}


def completion_logprobs(entries: list[LogprobEntry], tops: list[Any] | None,
                        offset: int) -> dict[str, Any]:
    """The legacy completions logprobs object; `text_offset` counts from `offset`."""
    tokens = [e[2] or "" for e in entries]
    offsets = []
    for token in tokens:
        offsets.append(offset)
        offset += len(token)
    top = None
    if tops is not None:
        top = [None if pos is None else {t[2] or "": t[0] for t in pos} for pos in tops]
    return {"tokens": tokens, "token_logprobs": [e[0] for e in entries], "top_logprobs": top,
            "text_offset": offsets}


def chat_logprobs(entries: list[LogprobEntry], tops: list[Any] | None) -> dict[str, Any]:
    """Chat's `{"content": [{token, logprob, bytes, top_logprobs}]}`."""
    content = []
    for k, entry in enumerate(entries):
        item = _chat_token(entry)
        pos = tops[k] if tops is not None and k < len(tops) else None
        item["top_logprobs"] = [_chat_token(t) for t in pos or []]
        content.append(item)
    return {"content": content}


def _chat_token(entry: LogprobEntry) -> dict[str, Any]:
    text = entry[2] or ""
    return {"token": text, "logprob": entry[0], "bytes": list(text.encode("utf-8"))}


class _Renderer:
    """What completions and chat share: headers, per-index progress, usage."""

    object_name = ""
    chunk_object = ""

    def __init__(self, plan: OpenAIPlan) -> None:
        self.plan = plan
        self.stream = plan.stream
        self._metas: dict[int, dict[str, Any]] = {}
        self._sent_text: dict[int, int] = {}
        self._sent_logprobs: dict[int, int] = {}

    def translate(self, exc: InvalidRequest) -> InvalidRequest:
        return translate(exc, self.plan.kind, self.plan.renames)

    def header(self, obj: str) -> dict[str, Any]:
        return {"id": self.plan.id, "object": obj, "created": self.plan.created,
                "model": self.plan.model}

    def final(self, result: Any) -> dict[str, Any]:
        outs = result if isinstance(result, list) else [result]
        choices = [self.choice(i, out) for i, out in enumerate(outs)]
        metas = [out["meta_info"] for out in outs]
        return {**self.header(self.object_name), "choices": choices,
                "usage": usage(metas, self.plan.n)}

    def choice(self, i: int, out: dict[str, Any]) -> dict[str, Any]:
        raise NotImplementedError

    def start(self) -> list[Any]:
        return []

    def chunks(self, out: dict[str, Any]) -> list[Any]:
        """The chunk for one cumulative output: only what is new since the last one."""
        i, meta = out.get("index", 0), out["meta_info"]
        first = i not in self._sent_text
        self._metas[i] = meta
        reason = finish_reason(meta)
        delta = self._text_delta(i, out["text"], reason is not None)
        entries, tops = self._new_logprobs(i, meta, first)
        if not delta and not entries and reason is None and not (first and self._echo(i)):
            return []
        choice = self.delta_choice(i, delta, first, entries, tops)
        choice["finish_reason"] = reason
        return [{**self.header(self.chunk_object), "choices": [choice]}]

    def _text_delta(self, i: int, text: str, finished: bool) -> str:
        """The text to send now for choice i's cumulative `text`."""
        delta = text[self._sent_text.get(i, 0):]
        self._sent_text[i] = len(text)
        return delta

    def delta_choice(self, i: int, delta: str, first: bool, entries: list[LogprobEntry],
                     tops: list[Any] | None) -> dict[str, Any]:
        raise NotImplementedError

    def _echo(self, i: int) -> str:
        return ""

    def _new_logprobs(self, i: int, meta: dict[str, Any],
                      first: bool) -> tuple[list[LogprobEntry], list[Any] | None]:
        if not self.plan.logprobs:
            return [], None
        start = self._sent_logprobs.get(i, 0)
        entries = meta.get("output_token_logprobs") or []
        tops = meta.get("output_top_logprobs")
        self._sent_logprobs[i] = len(entries)
        return entries[start:], None if tops is None else tops[start:]

    def end(self) -> list[Any]:
        if not self.plan.include_usage:
            return []
        metas = [self._metas[i] for i in sorted(self._metas)]
        return [{**self.header(self.chunk_object), "choices": [],
                 "usage": usage(metas, self.plan.n)}]


class CompletionRenderer(_Renderer):
    """/v1/completions: `text_completion` objects (and chunks of the same object type)."""

    object_name = chunk_object = "text_completion"

    def __init__(self, plan: OpenAIPlan) -> None:
        super().__init__(plan)
        self._text_offset: dict[int, int] = {}

    def _echo(self, i: int) -> str:
        texts = self.plan.echo_texts
        return texts[i // self.plan.n] if texts else ""

    def choice(self, i: int, out: dict[str, Any]) -> dict[str, Any]:
        meta = out["meta_info"]
        echo = self._echo(i)
        logprobs = None
        if self.plan.logprobs:
            entries, tops = self._all_logprobs(meta, bool(echo))
            logprobs = completion_logprobs(entries, tops, 0)
        return {"index": i, "text": echo + out["text"], "logprobs": logprobs,
                "finish_reason": finish_reason(meta),
                "matched_stop": (meta.get("finish_reason") or {}).get("matched")}

    @staticmethod
    def _all_logprobs(meta: dict[str, Any], echo: bool) -> tuple[list[Any], list[Any] | None]:
        entries = list(meta.get("output_token_logprobs") or [])
        tops = meta.get("output_top_logprobs")
        if echo:
            entries = list(meta.get("input_token_logprobs") or []) + entries
            if tops is not None:
                tops = list(meta.get("input_top_logprobs") or []) + list(tops)
        return entries, tops

    def delta_choice(self, i: int, delta: str, first: bool, entries: list[LogprobEntry],
                     tops: list[Any] | None) -> dict[str, Any]:
        echo = self._echo(i) if first else ""
        logprobs = None
        if self.plan.logprobs:
            offset = self._text_offset.get(i, 0)  # as in `choice`: the tokens' joined length
            logprobs = completion_logprobs(entries, tops, offset)
            self._text_offset[i] = offset + sum(len(t) for t in logprobs["tokens"])
        return {"index": i, "text": echo + delta, "logprobs": logprobs}

    def _new_logprobs(self, i: int, meta: dict[str, Any],
                      first: bool) -> tuple[list[LogprobEntry], list[Any] | None]:
        entries, tops = super()._new_logprobs(i, meta, first)
        if first and self.plan.logprobs and self._echo(i):
            entries = list(meta.get("input_token_logprobs") or []) + entries
            if tops is not None:
                tops = list(meta.get("input_top_logprobs") or []) + tops
        return entries, tops


class ChatRenderer(_Renderer):
    """/v1/chat/completions: `chat.completion` objects and `chat.completion.chunk` deltas."""

    object_name, chunk_object = "chat.completion", "chat.completion.chunk"

    def __init__(self, plan: OpenAIPlan, reasoning_parser: str = "none", tool_parser: str = "auto") -> None:
        super().__init__(plan)
        self.reasoning = REASONING_PARSERS.get(reasoning_parser) if plan.separate_reasoning else None
        self.tool_parser = tool_parser
        self._tool_streams: dict[int, ToolCallStream] = {}
        self._call_deltas: dict[int, list[dict[str, Any]]] = {}  # for the chunk being built
        self._reasoning_streams: dict[int, ReasoningStream] = {}
        self._reasoning_delta: dict[int, str] = {}  # for the chunk being built

    def choice(self, i: int, out: dict[str, Any]) -> dict[str, Any]:
        meta = out["meta_info"]
        logprobs = None
        if self.plan.logprobs:
            logprobs = chat_logprobs(meta.get("output_token_logprobs") or [],
                                     meta.get("output_top_logprobs"))
        text, reasoning = out["text"], None
        if self.reasoning is not None:
            split = split_reasoning(text, self.reasoning)
            text, reasoning = split.content, split.reasoning
        message: dict[str, Any] = {"role": "assistant", "content": text}
        reason = finish_reason(meta)
        tools = self.plan.tools
        if tools is not None:
            parsed = parse_for_plan(text, tools, self.tool_parser)
            if parsed.calls:
                message = {"role": "assistant", "content": parsed.content,
                           "tool_calls": [c.to_openai() for c in parsed.calls]}
                reason = _calls_reason(reason)
        if self.reasoning is not None:
            message["reasoning_content"] = reasoning
        return {"index": i, "message": message, "logprobs": logprobs, "finish_reason": reason,
                "matched_stop": (meta.get("finish_reason") or {}).get("matched")}

    def start(self) -> list[Any]:
        """The first chunk of every choice carries the role (OpenAI's order)."""
        role = {"role": "assistant", "content": ""}
        return [self._chunk(i, role, None) for i in range(self.plan.num_choices)]

    def chunks(self, out: dict[str, Any]) -> list[Any]:
        """As for any route; the step's thinking delta goes first, and its call deltas (id, type
        and name, then argument fragments) follow its content, each in a chunk of its own; a
        choice with calls ends in an empty chunk with the finish_reason (tool_calls when it
        stopped by itself)."""
        payloads = super().chunks(out)
        i = out.get("index", 0)
        thought = self._reasoning_delta.pop(i, "")
        if thought:  # the thinking delta rides on this step's chunk (or gets one of its own)
            if payloads:
                choice = payloads[0]["choices"][0]
                choice["delta"] = {"reasoning_content": thought, **choice["delta"]}
            else:
                payloads = [self._chunk(i, {"reasoning_content": thought}, None)]
        calls = self._call_deltas.pop(i, [])
        stream = self._tool_streams.get(i)
        if not calls and not (stream is not None and stream.calls):
            return payloads
        reason = payloads[-1]["choices"][0]["finish_reason"] if payloads else None
        kept = [p for p in payloads if p["choices"][0]["delta"] or p["choices"][0]["logprobs"]]
        for payload in kept:
            payload["choices"][0]["finish_reason"] = None
        tail = kept + [self._chunk(i, delta, None) for delta in calls]
        if reason is not None:
            tail.append(self._chunk(i, {}, _calls_reason(reason) if stream and stream.calls else reason))
        return tail

    def _text_delta(self, i: int, text: str, finished: bool) -> str:
        if self.reasoning is not None:  # what follows the thinking is the content
            thinking = self._reasoning_streams.setdefault(
                i, ReasoningStream(self.reasoning, self.plan.stream_reasoning))
            self._reasoning_delta[i], text = thinking.feed(text, finished)
        tools = self.plan.tools
        if tools is None:
            return super()._text_delta(i, text, finished)
        self._sent_text[i] = len(text)  # NOTE: only marks the choice as started
        stream = self._tool_streams.get(i)
        if stream is None:
            stream = self._tool_streams[i] = ToolCallStream.for_plan(tools, self.tool_parser)
        content = []
        for event in stream.events(text, finished):
            if isinstance(event, ContentDelta):
                content.append(event.text)
            else:
                delta = chat_delta(event)
                if delta is not None:
                    self._call_deltas.setdefault(i, []).append(delta)
        return "".join(content)

    def _chunk(self, i: int, delta: dict[str, Any], reason: str | None) -> dict[str, Any]:
        return {**self.header(self.chunk_object),
                "choices": [{"index": i, "delta": delta, "logprobs": None,
                             "finish_reason": reason}]}

    def delta_choice(self, i: int, delta: str, first: bool, entries: list[LogprobEntry],
                     tops: list[Any] | None) -> dict[str, Any]:
        logprobs = chat_logprobs(entries, tops) if self.plan.logprobs else None
        return {"index": i, "delta": {"content": delta} if delta else {}, "logprobs": logprobs}


def _calls_reason(reason: str | None) -> str | None:
    """A choice with calls: tool_calls when it stopped by itself (a cut one keeps length)."""
    return "tool_calls" if reason == "stop" else reason
