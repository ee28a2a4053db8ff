"""Anthropic's prompt caching (`cache_control`): where a body's breakpoints are, the rules
Anthropic checks them by, and the one cache pin they become.

A breakpoint marks the prompt up to and including its block, the prompt read in Anthropic's
order: tools, then system, then messages. Where one may sit (`spec.py`):

    tools.K.cache_control                              tools 0..K (with the system prompt, *)
    system.K.cache_control                             the tools, system blocks 0..K
    messages.I.content.J.cache_control                 ... messages 0..I-1, message I's blocks 0..J
    messages.I.content.J.content.L.cache_control       as its tool_result block J
    cache_control (top level: automatic caching)       the last block of the last message

(*) Templates render the tools inside the system message, most after its text, so a tool's
breakpoint covers the system prompt too.

Rules (400s naming the field): at most MAX_BREAKPOINTS (the top-level one takes a slot unless
the last block has its own), and no 1h breakpoint after a 5m one, as Anthropic requires.

radixserve caches every prefix it computes anyway, evicting the least recently used first; a
breakpoint adds a pin (`CachePin`): the prompt up to the last breakpoint is kept from eviction
for the longest TTL given (300 or 3600 seconds), unless the scheduler refuses the pin (a cap on
pinned tokens). One pin per request: every earlier breakpoint's prefix is inside it.
"""

from __future__ import annotations

from typing import NamedTuple

from runtime.contracts.errors import InvalidRequest
from tokenizer.anthropic.spec import CacheControl, CountBody, ToolResultBlock

MAX_BREAKPOINTS = 4
TTL_S = {"5m": 300.0, "1h": 3600.0}
SECTIONS = ("tools", "system", "messages")  # Anthropic's prompt order


class Breakpoint(NamedTuple):
    """A block that carries `cache_control`: its place in prompt order and its TTL."""

    section: str  # tools | system | messages
    item: int  # the tool, system block or message
    block: int  # the message's block (-1 for tools and system blocks)
    ttl: str  # 5m | 1h
    param: str  # the field, for errors

    @property
    def order(self) -> tuple[int, int, int]:
        return SECTIONS.index(self.section), self.item, self.block


class Cut(NamedTuple):
    """Where the pinned part of the prompt ends (the last breakpoint's block), and its TTL."""

    section: str
    item: int
    block: int
    ttl_s: float


def cache_cut(body: CountBody) -> Cut | None:
    """The end and TTL of the body's pin (None without breakpoints). Raises InvalidRequest
    naming the field for more than MAX_BREAKPOINTS, or a 1h breakpoint after a 5m one."""
    points = sorted(breakpoints(body), key=lambda p: p.order)
    if not points:
        return None
    if len(points) > MAX_BREAKPOINTS:
        raise InvalidRequest.field(points[MAX_BREAKPOINTS].param, f"a maximum of {MAX_BREAKPOINTS} blocks with "
                                                                  f"cache_control may be provided, found {len(points)}")
    seen_short = False
    for p in points:
        if p.ttl == "1h" and seen_short:
            raise InvalidRequest.field(f"{p.param}.ttl", "a 1h cache_control breakpoint may not come after a 5m "
                                                          "one (longer TTLs come first: tools, system, messages)")
        seen_short = seen_short or p.ttl == "5m"
    last = points[-1]
    return Cut(last.section, last.item, last.block, max(TTL_S[p.ttl] for p in points))


def breakpoints(body: CountBody) -> list[Breakpoint]:
    """Every block of the body that carries `cache_control`, the top-level one included."""
    out = [_point("tools", k, -1, t.cache_control, f"tools.{k}") for k, t in enumerate(body.tools or [])
           if t.cache_control is not None]
    if isinstance(body.system, list):
        out += [_point("system", k, -1, b.cache_control, f"system.{k}") for k, b in enumerate(body.system)
                if b.cache_control is not None]
    for i, m in enumerate(body.messages):
        for j, b in enumerate(m.content if isinstance(m.content, list) else []):
            where = f"messages.{i}.content.{j}"
            if b.cache_control is not None:
                out.append(_point("messages", i, j, b.cache_control, where))
            if isinstance(b, ToolResultBlock) and isinstance(b.content, list):
                out += [_point("messages", i, j, t.cache_control, f"{where}.content.{n}")
                        for n, t in enumerate(b.content) if t.cache_control is not None]
    automatic = _automatic(body)
    return out if automatic is None else [*out, automatic]


def _automatic(body: CountBody) -> Breakpoint | None:
    """The top-level breakpoint, on the last block of the last message (None without one, or
    when that block carries its own)."""
    if body.cache_control is None:
        return None
    i = len(body.messages) - 1
    content = body.messages[i].content
    if isinstance(content, str):
        return _point("messages", i, 0, body.cache_control, "")
    if content and content[-1].cache_control is not None:
        return None
    return _point("messages", i, len(content) - 1, body.cache_control, "")


def _point(section: str, item: int, block: int, control: CacheControl, where: str) -> Breakpoint:
    param = f"{where}.cache_control" if where else "cache_control"
    return Breakpoint(section, item, block, control.ttl or "5m", param)
