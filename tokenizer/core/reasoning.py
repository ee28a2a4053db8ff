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
    """One choice's output pushed as it grows: `push(delta, finished)` gives the reasoning and the
    content to send now. The same rules as `split_reasoning`, decided as early as the text
    allows: held back are an opening that may still become the start tag, the reasoning's
    trailing whitespace, any partial closing tag, and the content's leading whitespace. It keeps
    only that undecided tail, so a push costs its delta, not the whole output.

    Phases: lead (before the block is decided) -> reasoning -> gap (whitespace after the closing
    tag) -> content; an output without a block goes from lead to content as it is."""

    def __init__(self, fmt: ReasoningFormat, stream_reasoning: bool = True) -> None:
        self.fmt, self.stream_reasoning = fmt, stream_reasoning
        self.phase = "lead"
        self.held = ""  # undecided text of the current phase
        self.started = False  # reasoning text (not whitespace) was sent

    def push(self, delta: str, finished: bool) -> tuple[str, str]:
        """(reasoning delta, content delta) for `delta`; once `finished`, nothing is held."""
        self.held += delta
        reasoning = content = ""
        if self.phase == "lead":
            self._lead(finished)
        if self.phase == "reasoning":
            reasoning = self._reasoning(finished)
        if self.phase == "gap":
            stripped = self.held.lstrip()
            if stripped or finished:
                self.phase, self.held = "content", stripped
        if self.phase == "content":
            content, self.held = self.held, ""
        return reasoning, content

    def _lead(self, finished: bool) -> None:
        start, stripped = self.fmt.start, self.held.lstrip()
        if stripped.startswith(start):
            self.phase, self.held = "reasoning", stripped[len(start):]
        elif start.startswith(stripped) and not finished:
            return  # blank so far, or a partial opening tag: undecided
        elif self.fmt.opened_in_prompt:
            self.phase, self.held = "reasoning", stripped
        else:
            self.phase = "content"

    def _reasoning(self, finished: bool) -> str:
        """The reasoning to send now: up to the closing tag (then the gap), else what can be
        neither trailing whitespace nor part of the tag (all of it once finished)."""
        end = self.fmt.end
        if not self.started:
            self.held = self.held.lstrip()
        k = self.held.find(end)
        if k >= 0:
            body, self.held, self.phase = self.held[:k].rstrip(), self.held[k + len(end):], "gap"
            return self._send(body)
        if finished:
            body, self.held = self.held.rstrip(), ""
            return self._send(body)
        if not self.stream_reasoning:
            return ""
        keep = len(self.held) - partial_stop_suffix_len(self.held, [end])
        body = self.held[:keep].rstrip()
        self.held = self.held[len(body):]
        return self._send(body)

    def _send(self, body: str) -> str:
        if body:
            self.started = True
        return body
