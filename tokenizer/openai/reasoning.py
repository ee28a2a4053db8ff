"""Reasoning parsers (`--reasoning-parser`): a chat answer's thinking text goes to
`reasoning_content`, the rest to `content`, in responses and in streamed deltas (pure: no I/O).

    qwen3        <think>...</think>answer    reasoning only when the output opens with <think>
                                             (Qwen3; with enable_thinking=False the template
                                             closes an empty block in the prompt: all content)
    deepseek-r1  ...</think>answer           the template opened the block in the prompt: the
                                             output is reasoning until </think>

Rules (SGLang's detectors, with whitespace made exact so that streamed deltas join to the
non-streamed fields): the reasoning is the text between the tags without its leading and
trailing whitespace; the content is what follows the closing tag without its leading
whitespace; an output that ends inside the block is reasoning only (content ""). A request's
`separate_reasoning: false` turns the split off; `stream_reasoning: false` sends the reasoning
in one delta once it is complete.

A grammar (response_format, a forced tool call, text.format) applies from the end of the
reasoning on, as in SGLang and vLLM, when the output begins inside the block
(`opens_in_reasoning`): the chat routes then send the closing tag's token ids as the sampling
field `grammar_after_ids`, and the scheduler leaves the output unconstrained until it ends with
them. Otherwise (no parser, the split turned off, a template that closed the block in the
prompt, a model whose template knows no reasoning) the grammar applies from the first token.
"""

from __future__ import annotations

from dataclasses import dataclass

from runtime.contracts.stop import partial_stop_suffix_len


@dataclass(frozen=True, slots=True)
class ReasoningFormat:
    start: str
    end: str
    opened_in_prompt: bool  # the output begins inside the block (no opening tag of its own)


PARSERS = {
    "qwen3": ReasoningFormat("<think>", "</think>", opened_in_prompt=False),
    "deepseek-r1": ReasoningFormat("<think>", "</think>", opened_in_prompt=True),
}


@dataclass(slots=True)
class Split:
    reasoning: str | None  # None: the output has no reasoning block
    content: str
    open: bool  # still inside the block (more reasoning may come)


def split_reasoning(text: str, fmt: ReasoningFormat) -> Split:
    """The finished `text` split (see the module docstring)."""
    begin = _reasoning_start(text, fmt)
    if begin is None:
        return Split(None, text, False)
    end = text.find(fmt.end, begin)
    if end < 0:
        return Split(text[begin:].strip(), "", True)
    return Split(text[begin:end].strip(), text[end + len(fmt.end):].lstrip(), False)


def opens_in_reasoning(fmt: ReasoningFormat, prompt: str, template: str) -> bool:
    """Does the output of `prompt` (the rendered chat template, whose source is `template`)
    begin inside a reasoning block? Yes when the prompt ends with the opening tag (the template
    opened it); no when it ends with the closing tag (Qwen3's enable_thinking=False closes an
    empty block); otherwise yes for a format whose template opens the block, and for one whose
    output opens it, only when the template knows the closing tag (a thinking model: a model
    that never reasons writes no <think>, and its grammar must hold from the first token).

    NOTE: only the prompt's end is read: a message that quotes a tag changes nothing."""
    tail = prompt.rstrip()
    if tail.endswith(fmt.start):
        return True
    if tail.endswith(fmt.end):
        return False
    return fmt.opened_in_prompt or fmt.end in template


def _reasoning_start(text: str, fmt: ReasoningFormat) -> int | None:
    """Where the reasoning begins in `text`, or None when the output has none."""
    if fmt.opened_in_prompt:
        stripped = text.lstrip()
        skip = len(fmt.start) if stripped.startswith(fmt.start) else 0  # some models repeat it
        return len(text) - len(stripped) + skip
    stripped = text.lstrip()
    if not stripped.startswith(fmt.start):
        return None
    return len(text) - len(stripped) + len(fmt.start)


class ReasoningStream:
    """One streamed choice: `feed(cumulative text)` gives the reasoning delta to send now and the
    content so far (cumulative, safe to send). Held back: an opening that may still become the
    start tag, the reasoning's trailing whitespace and any partial closing tag."""

    def __init__(self, fmt: ReasoningFormat, stream_reasoning: bool = True) -> None:
        self.fmt, self.stream_reasoning = fmt, stream_reasoning
        self.sent = 0  # reasoning characters sent

    def feed(self, text: str, finished: bool) -> tuple[str, str]:
        fmt = self.fmt
        stripped = text.lstrip()
        if not finished and not fmt.opened_in_prompt and fmt.start.startswith(stripped):
            return "", ""  # blank so far, or a partial opening tag: undecided
        split = split_reasoning(text, fmt)
        reasoning, content = split.reasoning or "", split.content
        if not finished:
            if split.reasoning is None:
                return "", text
            if split.open:  # send what cannot be trailing whitespace or part of the closing tag
                if not self.stream_reasoning:
                    return "", ""
                body = text[_reasoning_start(text, fmt) or 0:].lstrip()
                reasoning = body[: len(body) - partial_stop_suffix_len(body, [fmt.end])].rstrip()
        delta = reasoning[self.sent:]
        self.sent = len(reasoning)
        return delta, content
