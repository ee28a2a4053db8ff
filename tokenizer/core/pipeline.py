"""The core every protocol runs through: render a chat, submit, and read the outputs into the
typed event stream (`events.py`).

    updates = await generate(tm, req)          # InvalidRequest / RuntimeCrashed raise here
    async with contextlib.aclosing(updates):
        async for update in updates:            # one choice's events per update
            ...

A chat prompt is rendered by its template off the event loop and tokenized without adding
special tokens (the template has them). Under a reasoning parser, a grammar waits for the end of
the reasoning (`grammar_after_ids`) when the output begins inside the reasoning block. A cache
pin's chat (the conversation cut after its last breakpoint) is rendered by the same template, and
the pin covers the tokens it shares with the whole prompt. The text of each update goes through
the choice's `ChoiceReader` once, so every protocol's answer, streamed or not, is folded from the
same events.
"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from runtime.contracts.errors import InvalidRequest
from runtime.contracts.sampling import GRAMMAR_FIELDS
from tokenizer.core.chat_template import render_chat
from tokenizer.core.choices import ChoiceReader
from tokenizer.core.events import Event, Finished, InputLogprobs, Tokens, Update, Usage
from tokenizer.core.reasoning import opens_in_reasoning
from tokenizer.core.request import ChatInput, GenRequest, PromptRequest
from tokenizer.core.tool_prompts import adapt_to_template
from tokenizer.limits import check_prompt_chars

if TYPE_CHECKING:
    from tokenizer.manager import Taken, TokenizerManager



@dataclass(frozen=True, slots=True)
class RenderedPrompt:
    """A chat as the template rendered it, its token ids and the template's source."""

    text: str
    ids: list[int]
    template: str


async def generate(tm: TokenizerManager, req: GenRequest) -> AsyncIterator[Update]:
    """Render, check and send `req`; the iterator of its updates (see the module docstring)."""
    try:
        req = await render_chats(tm, req)
    except InvalidRequest as exc:
        raise exc.renamed(req.names) from None
    taken = await tm.submit(req)
    return read_updates(req, taken)


async def render_chats(tm: TokenizerManager, req: GenRequest) -> GenRequest:
    """`req` with each chat prompt replaced by its rendered ids."""
    if not any(isinstance(p.prompt, ChatInput) for p in req.prompts):
        return req
    prompts = [await _render_prompt(tm, req, p) if isinstance(p.prompt, ChatInput) else p for p in req.prompts]
    return dataclasses.replace(req, prompts=prompts)


async def _render_prompt(tm: TokenizerManager, req: GenRequest, prompt: PromptRequest) -> PromptRequest:
    chat = prompt.prompt
    assert isinstance(chat, ChatInput)
    check_prompt_chars(prompt.field, chat.chars(), tm.limits)
    rendered = await render(tm, chat)
    sampling = dict(prompt.sampling)
    fmt = req.read.reasoning
    has_grammar = any(sampling.get(g) is not None for g in GRAMMAR_FIELDS)
    if fmt is not None and has_grammar and opens_in_reasoning(fmt, rendered.text, rendered.template):
        marker = await tm.encoder.encode_texts([fmt.end], add_special_tokens=False)
        sampling["grammar_after_ids"] = list(marker[0])
    pin = prompt.pin
    if pin is not None and isinstance(pin.upto, ChatInput):
        pin = dataclasses.replace(pin, upto=await _pinned_tokens(tm, pin.upto, chat, rendered.ids))
    return dataclasses.replace(prompt, prompt=rendered.ids, sampling=sampling, pin=pin)


async def _pinned_tokens(tm: TokenizerManager, upto: ChatInput, chat: ChatInput, ids: list[int]) -> int:
    """How many leading tokens of `ids` (the whole chat's) the chat cut at the pin's end renders
    to. NOTE: the longest common prefix, not the cut's own length: its rendering ends with a
    generation prompt (and a template may render a last message differently), so past the cut
    the two differ, and a pin must never hold a token the prompt lacks. A cut the template cannot
    render pins nothing."""
    if upto == chat:
        return len(ids)
    try:
        cut = await render(tm, upto)
    except InvalidRequest:
        return 0
    return common_prefix(cut.ids, ids)


def common_prefix(a: list[int], b: list[int], step: int = 1024) -> int:
    """The length of the longest common prefix (slices compared in C a step at a time)."""
    n, i = min(len(a), len(b)), 0
    while i + step <= n and a[i:i + step] == b[i:i + step]:
        i += step
    while i < n and a[i] == b[i]:
        i += 1
    return i


async def render(tm: TokenizerManager, chat: ChatInput) -> RenderedPrompt:
    """The chat template's prompt for `chat`, and its ids."""
    template = chat.template
    source = template.source if template is not None else template_source(tm)
    tools = chat.tools.as_openai_tools() if chat.tools is not None else None
    kwargs: dict[str, Any] = {**chat.variables, "tools": tools} if tools else dict(chat.variables)
    messages, kwargs = adapt_to_template(source, chat.messages, kwargs)
    text = await render_chat(tm, messages, kwargs.pop("tools", None), kwargs, template)
    ids = await tm.encoder.encode_texts([text], add_special_tokens=False)
    return RenderedPrompt(text, list(ids[0]), source)


def template_source(tm: TokenizerManager) -> str:
    """The chat template's Jinja source ("" when the tokenizer has none)."""
    template = getattr(tm.tokenizer, "chat_template", None)
    if isinstance(template, dict):  # named templates: any of them may be used
        return "\n".join(str(t) for t in template.values())
    return template if isinstance(template, str) else ""


async def read_updates(req: GenRequest, taken: AsyncIterator[Taken]) -> AsyncIterator[Update]:
    """Each state delta as its choice's events. NOTE: closing this iterator closes `taken`, whose
    `finally` aborts what still runs."""
    readers: dict[int, ChoiceReader] = {}
    try:
        async for i, delta in taken:
            reader = readers.get(i)
            if reader is None:
                reader = readers[i] = ChoiceReader(i, req.read)
            events: list[Event] = []
            if delta.input is not None:
                events.append(InputLogprobs(i, delta.input[0], delta.input[1]))
            reason = delta.finish_reason
            events += reader.read(delta.text, reason is not None)
            usage = Usage(delta.prompt_tokens, delta.completion_tokens, delta.cached_tokens, delta.pinned_tokens)
            events.append(Tokens(i, delta.ids, delta.logprobs, delta.tops, usage))
            if reason is not None:
                events.append(Finished(i, reason, usage, delta.label, delta.latency))
            yield Update(i, events)
    finally:
        await taken.aclose()  # type: ignore[attr-defined]
