"""Anthropic's `cache_control` without a model (tokenizer/anthropic/caching.py and messages.py):
taken wherever Anthropic takes it, refused (400 naming the field) where its rules refuse it, the
pin it becomes (`pin_prefix_len` against the default model's chat template and tokenizer), and
the usage split from the scheduler's cached and pinned counts, streamed and not, through the
routes in-process and through the official `anthropic` client.

The routes run against a TokenizerManager without a runtime: `submit` renders and tokenizes as the
real one does, records each GenerateReq, and answers "Hello" with the counts the test gives."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import anthropic
import orjson
import pytest
from aiohttp.test_utils import TestClient, TestServer

from runtime.contracts.config import ServerConfig
from runtime.contracts.errors import InvalidRequest
from tokenizer.admission import PromptEncoder
from tokenizer.anthropic.messages import MessageAnswer, parse_count, parse_messages, usage
from tokenizer.core.events import Finished, TextDelta, Tokens, Update, Usage
from tokenizer.core.pipeline import render_chats
from tokenizer.core.request import ChatInput
from tokenizer.fanout import Prepared
from tokenizer.http_server import create_app
from tokenizer.labels import InternalRids, LabelIndex
from tokenizer.limits import RequestLimits
from tokenizer.manager import Reservation, Taken, TokenizerManager
from tokenizer.request_state import StateDelta
from tokenizer.server_state import ServerState

T = TypeVar("T")
CONTEXT = 4096
CC = {"type": "ephemeral"}
CC_1H = {"type": "ephemeral", "ttl": "1h"}
SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}}
TOOLS = [{"name": f"tool_{i}", "description": f"The tool number {i}.", "input_schema": SCHEMA} for i in range(2)]
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


def _text(text: str, control: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"type": "text", "text": text, **({"cache_control": control} if control else {})}


def _body(**extra: Any) -> dict[str, Any]:
    return {"model": "m", "max_tokens": 8, "messages": ASK, **extra}


def _called(use: dict[str, Any] | None = None, result: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """A conversation with a tool call and its result; `use` / `result` are added to those blocks."""
    call = {"type": "tool_use", "id": "toolu_1", "name": "tool_0", "input": {"city": "Paris"}, **(use or {})}
    answer = {"type": "tool_result", "tool_use_id": "toolu_1", "content": "18C", **(result or {})}
    return [*ASK, {"role": "assistant", "content": [call]}, {"role": "user", "content": [answer, _text("Thanks.")]}]


# Every place Anthropic takes cache_control: the body's fields with a breakpoint there.
PLACES: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {
    "a tool": lambda c: {"tools": [TOOLS[0], {**TOOLS[1], "cache_control": c}]},
    "a system block": lambda c: {"system": [_text("Be brief.", c), _text("Be kind.")]},
    "a user text block": lambda c: {"messages": [{"role": "user", "content": [_text("Hi.", c), _text("Bye.")]}]},
    "a tool_use block": lambda c: {"tools": TOOLS, "messages": _called(use={"cache_control": c})},
    "a tool_result block": lambda c: {"tools": TOOLS, "messages": _called(result={"cache_control": c})},
    "a tool_result's text": lambda c: {"tools": TOOLS, "messages": _called(result={"content": [_text("18C", c)]})},
    "an assistant text block": lambda c: {"messages": [*ASK, {"role": "assistant", "content": [_text("Sunny.", c)]},
                                                       *ASK]},
    "the top level": lambda c: {"cache_control": c},
}


@pytest.mark.parametrize("place", PLACES)
@pytest.mark.parametrize("control, ttl_s", [(CC, 300.0), ({**CC, "ttl": "5m"}, 300.0), (CC_1H, 3600.0)])
def test_cache_control_is_taken_wherever_anthropic_takes_it(place: str, control: dict[str, Any],
                                                            ttl_s: float) -> None:
    body = _body(**PLACES[place](control))
    parsed = parse_messages(body, ServerConfig(), "smol")
    pin = parsed.req.prompts[0].pin
    assert pin is not None and pin.ttl_s == ttl_s == parsed.cache_ttl_s
    assert isinstance(pin.upto, ChatInput)
    assert parse_count({k: v for k, v in body.items() if k != "max_tokens"}).messages  # count_tokens too


def test_without_cache_control_there_is_no_pin() -> None:
    parsed = parse_messages(_body(system=[_text("Be brief.")], tools=TOOLS), ServerConfig(), "smol")
    assert parsed.req.prompts[0].pin is None and parsed.cache_ttl_s == 0


def _five(last: dict[str, Any] | None = CC) -> dict[str, Any]:
    """Four breakpoints (two tools, two system blocks) and `last` on the user's text block."""
    tools = [{**t, "cache_control": CC} for t in TOOLS]
    system = [_text("One.", CC), _text("Two.", CC)]
    return _body(tools=tools, system=system, messages=[{"role": "user", "content": [_text("Hi.", last)]}])


BAD = [
    ("five breakpoints", _five(), "messages.0.content.0.cache_control"),
    ("four and the top level", {**_five(None), "cache_control": CC}, "cache_control"),
    ("a type Anthropic does not have", _body(system=[_text("x", {"type": "persistent"})]),
     "system.0.cache_control.type"),
    ("a ttl Anthropic does not have", _body(tools=[{**TOOLS[0], "cache_control": {**CC, "ttl": "10m"}}]),
     "tools.0.cache_control.ttl"),
    ("a ttl in seconds", _body(cache_control={**CC, "ttl": 300}), "cache_control.ttl"),
    ("a string", _body(messages=[{"role": "user", "content": [_text("x", "ephemeral")]}]),  # type: ignore[arg-type]
     "messages.0.content.0.cache_control"),
    ("an unknown field", _body(system=[_text("x", {**CC, "scope": "global"})]), "system.0.cache_control.scope"),
    ("no type", _body(cache_control={"ttl": "5m"}), "cache_control.type"),
    ("1h after 5m", _body(system=[_text("x", CC)], cache_control=CC_1H), "cache_control.ttl"),
    ("a nested 1h after a 5m", _body(tools=TOOLS, messages=_called(use={"cache_control": CC},
                                                                   result={"content": [_text("18C", CC_1H)]})),
     "messages.2.content.0.content.0.cache_control.ttl"),
]


@pytest.mark.parametrize("name, body, param", BAD, ids=[b[0] for b in BAD])
def test_bad_breakpoints_are_400s_naming_the_field(name: str, body: dict[str, Any], param: str) -> None:
    for parse in (lambda b: parse_messages(b, ServerConfig(), "smol"), parse_count):
        with pytest.raises(InvalidRequest) as info:
            parse(body if parse is not parse_count else {k: v for k, v in body.items() if k != "max_tokens"})
        assert info.value.param == param, info.value.message  # InvalidRequest: a 400
        assert info.value.message.startswith(param + ":")
    if "breakpoints" in name or "four" in name:
        assert "a maximum of 4 blocks with cache_control" in info.value.message


def test_four_breakpoints_pass_and_the_top_level_one_on_a_marked_block_takes_no_slot() -> None:
    four = _five()
    four["system"] = four["system"][:1]
    parsed = parse_messages({**four, "cache_control": CC}, ServerConfig(), "smol")
    assert parsed.req.prompts[0].pin is not None  # the 5th would be the last block's own
    long_first = _body(system=[_text("x", CC_1H)], cache_control=CC)  # 1h before 5m: the longest TTL wins
    assert parse_messages(long_first, ServerConfig(), "smol").cache_ttl_s == 3600.0


# ---------------------------------------------------------------- the pin's length


class Manager(TokenizerManager):
    """A TokenizerManager without sockets or a runtime: `submit` checks, renders and tokenizes as
    the real one does; each request it would send is kept in `sent` and answers "Hello" (two
    updates) with `cached` and `pinned` as the scheduler's counts."""

    def __init__(self, tokenizer: Any, cached: int = 0, pinned: int = 0) -> None:  # NOTE: no sockets
        self.config, self.tokenizer = ServerConfig(), tokenizer
        self.encoder = PromptEncoder(tokenizer)
        self.vocab_size, self.context_length = len(tokenizer), CONTEXT
        self.scheduler_info = {"vocab_size": self.vocab_size}
        self.limits = RequestLimits(vocab_size=self.vocab_size, context_length=CONTEXT, kv_total=None, max_n=4,
                                    max_top_logprobs=20)
        self.rid_to_state, self.labels, self._rids, self._reserved = {}, LabelIndex(), InternalRids(), 0
        self.max_live, self.dead_reason, self.on_output, self.on_reject = 64, None, None, None
        self.cached, self.pinned = cached, pinned
        self.sent: list[Prepared] = []

    async def _run(self, prepared: list[Prepared], stream: bool, reservation: Reservation) -> AsyncIterator[Taken]:
        reservation.release()
        self.sent.extend(prepared)
        for i, p in enumerate(prepared):
            n = len(p.req.input_ids)
            if stream:
                yield i, StateDelta("Hel", [1], None, None, None, n, 1, self.cached, None, p.label, 0.0, self.pinned)
            yield i, StateDelta("lo" if stream else "Hello", [2], None, None, None, n, 2, self.cached,
                                {"type": "length"}, p.label, 0.0, self.pinned)


@pytest.fixture
def manager(default_tokenizer: Any) -> Manager:
    return Manager(default_tokenizer)


def _rendered(manager: Manager, body: dict[str, Any]) -> tuple[int, list[int], str]:
    """(the pin's token count, the prompt's ids, its text) of a body, as the pipeline renders it."""
    parsed = parse_messages(body, ServerConfig(), "smol")
    prompt = asyncio.run(render_chats(manager, parsed.req)).prompts[0]
    assert isinstance(prompt.prompt, list) and prompt.pin is not None and isinstance(prompt.pin.upto, int)
    return prompt.pin.upto, prompt.prompt, manager.tokenizer.decode(prompt.prompt)


def _tokens_before(manager: Manager, text: str, end: int) -> int:
    """How many tokens the prompt text up to character `end` encodes to."""
    return len(manager.tokenizer.encode(text[:end], add_special_tokens=False))


@pytest.mark.parametrize("body, marked", [
    (_body(system=[_text("Alpha system block.", CC), _text("Second block.")]), "Alpha system block."),
    (_body(messages=[{"role": "user", "content": [_text("Alpha beta gamma.", CC), _text("Delta.")]}]),
     "Alpha beta gamma."),
    (_body(tools=[{**TOOLS[0], "cache_control": CC}, TOOLS[1]]), '"description": "The tool number 0.", '),
])
def test_the_pin_is_the_prompt_up_to_the_marked_block(manager: Manager, body: dict[str, Any], marked: str) -> None:
    """Within a message (blocks joined by a blank line), the pin ends exactly after the marked
    block's text; a tool's ends inside its own listing (the tool prompt lists one JSON per line)."""
    pinned, ids, text = _rendered(manager, body)
    end = text.index(marked) + len(marked)
    if marked.startswith('"description"'):  # the listing's line: up to its closing braces
        end = text.index("\n", end)
        assert _tokens_before(manager, text, text.index(marked)) < pinned <= _tokens_before(manager, text, end)
    else:
        assert pinned == _tokens_before(manager, text, end) and text[end:].startswith("\n\n")
    assert 0 < pinned < len(ids)


def test_the_pin_at_a_turns_end_reaches_the_next_turns_header(manager: Manager) -> None:
    """The cut ends with the generation prompt, which the next (assistant) turn's header matches."""
    messages = [{"role": "user", "content": [_text("First question.", CC)]},
                {"role": "assistant", "content": "Answer."}, {"role": "user", "content": "Next."}]
    pinned, ids, text = _rendered(manager, _body(messages=messages))
    turn_end = text.index("First question.<|im_end|>\n") + len("First question.<|im_end|>\n")
    header = text.index("Answer.")
    assert _tokens_before(manager, text, turn_end) < pinned == _tokens_before(manager, text, header) < len(ids)


@pytest.mark.parametrize("extra", [{"cache_control": CC},
                                   {"messages": [{"role": "user", "content": [_text("Hi.", CC)]}]}])
def test_the_last_block_pins_the_whole_prompt(manager: Manager, extra: dict[str, Any]) -> None:
    pinned, ids, _ = _rendered(manager, _body(system="Be brief.", **extra))
    assert pinned == len(ids)


# ---------------------------------------------------------------- usage


def test_usage_splits_the_prompt_into_read_written_and_the_rest() -> None:
    u = Usage(prompt_tokens=100, completion_tokens=5, cached_tokens=30, pinned_tokens=50)
    assert usage(u, 300.0) == {"input_tokens": 20, "output_tokens": 5, "cache_creation_input_tokens": 50,
                               "cache_read_input_tokens": 30,
                               "cache_creation": {"ephemeral_5m_input_tokens": 50, "ephemeral_1h_input_tokens": 0}}
    assert usage(u, 3600.0)["cache_creation"] == {"ephemeral_5m_input_tokens": 0, "ephemeral_1h_input_tokens": 50}
    assert usage(Usage(10, 1, 8, 5), 300.0)["input_tokens"] == 0  # never negative
    refused = usage(Usage(100, 5, 30, 0), 300.0)  # the scheduler refused the pin (its cap)
    assert (refused["input_tokens"], refused["cache_creation_input_tokens"]) == (70, 0)
    # Without cache_control: the shape and numbers of before (no cache_creation object).
    assert usage(Usage(100, 5, 30)) == {"input_tokens": 70, "output_tokens": 5, "cache_creation_input_tokens": 0,
                                        "cache_read_input_tokens": 30}


def _events(body: dict[str, Any], u: Usage) -> list[dict[str, Any]]:
    answer = MessageAnswer(parse_messages({**body, "stream": True}, ServerConfig(), "smol"))
    out = answer.start()
    for events in ([TextDelta(0, "Hi"), Tokens(0, [1], None, None, u)],
                   [Tokens(0, [2], None, None, u), Finished(0, {"type": "length"}, u, "r", 0.0)]):
        out += answer.update(Update(0, events))  # type: ignore[arg-type]
    return out + answer.end()


def test_a_stream_with_cache_control_starts_with_the_schedulers_counts() -> None:
    u = Usage(100, 1, 30, 50)
    events = _events(_body(cache_control=CC_1H), u)
    assert [e["type"] for e in events][:3] == ["message_start", "ping", "content_block_start"]
    expected = usage(u, 3600.0)
    assert events[0]["message"]["usage"] == expected and events[-2]["usage"] == expected
    plain = _events(_body(), u)  # without: message_start goes first, before any count, as it always did
    assert plain[0]["message"]["usage"] == usage(Usage(0, 0, 0)) and plain[-2]["usage"] == usage(u)


# ---------------------------------------------------------------- the routes, in-process


def _serve(manager: Manager, talk: Callable[[TestClient[Any, Any]], Awaitable[T]]) -> T:
    async def run() -> T:
        server = ServerState(manager.config)
        server.attach(manager)
        try:
            async with TestClient(TestServer(create_app(server))) as client:
                return await talk(client)
        finally:
            manager.encoder.close()

    return asyncio.run(run())


def _sse(raw: bytes) -> list[dict[str, Any]]:
    return [orjson.loads(line[6:]) for line in raw.split(b"\n") if line.startswith(b"data: ")]


def test_the_route_sends_the_pin_and_answers_the_split(default_tokenizer: Any) -> None:
    manager = Manager(default_tokenizer, cached=4, pinned=9)
    body = _body(system=[_text("You are a careful assistant.", CC_1H)])

    async def talk(client: TestClient[Any, Any]) -> tuple[Any, ...]:
        plain = await client.post("/v1/messages", json=body)
        streamed = await client.post("/v1/messages", json={**body, "stream": True})
        bad = await client.post("/v1/messages", json=_body(cache_control={**CC, "ttl": "2h"}))
        return plain.status, await plain.json(), await streamed.read(), bad.status, await bad.json()

    status, plain, streamed, bad_status, bad = _serve(manager, talk)
    sent = manager.sent[0].req
    assert status == 200 and 0 < sent.pin_prefix_len < len(sent.input_ids) and sent.pin_ttl_s == 3600.0
    prompt = len(sent.input_ids)
    assert plain["usage"] == {"input_tokens": prompt - 13, "output_tokens": 2, "cache_creation_input_tokens": 9,
                              "cache_read_input_tokens": 4,
                              "cache_creation": {"ephemeral_5m_input_tokens": 0, "ephemeral_1h_input_tokens": 9}}
    events = _sse(streamed)
    assert events[0]["type"] == "message_start"  # with the counts of the first output (one token)
    assert events[0]["message"]["usage"] == {**plain["usage"], "output_tokens": 1}
    assert events[-2]["type"] == "message_delta" and events[-2]["usage"] == plain["usage"]
    assert bad_status == 400 and bad["type"] == "error" and bad["error"]["type"] == "invalid_request_error"
    assert bad["error"]["message"].startswith("cache_control.ttl: ")
    assert len(manager.sent) == 2  # the bad body sent nothing


def test_without_cache_control_nothing_is_pinned(default_tokenizer: Any) -> None:
    manager = Manager(default_tokenizer, cached=4)

    async def talk(client: TestClient[Any, Any]) -> Any:
        return await (await client.post("/v1/messages", json=_body(system="Be brief."))).json()

    answer = _serve(manager, talk)
    sent = manager.sent[0].req
    assert (sent.pin_prefix_len, sent.pin_ttl_s) == (0, 0.0)
    assert answer["usage"] == {"input_tokens": len(sent.input_ids) - 4, "output_tokens": 2,
                               "cache_creation_input_tokens": 0, "cache_read_input_tokens": 4}


def test_the_anthropic_client_sends_cache_control_and_reads_the_split(default_tokenizer: Any) -> None:
    """The official client, unmodified, against the in-process routes (a real port)."""
    manager = Manager(default_tokenizer, cached=3, pinned=11)

    def ask(url: str) -> tuple[Any, Any]:
        client = anthropic.Anthropic(base_url=url, api_key="x", max_retries=0, timeout=30)
        kwargs: Any = {"model": "m", "max_tokens": 8, "tools": [{**TOOLS[0], "cache_control": CC}],
                       "system": [{"type": "text", "text": "Be brief.", "cache_control": CC}],
                       "messages": [{"role": "user", "content": [
                           {"type": "text", "text": "Hi.", "cache_control": {"type": "ephemeral", "ttl": "5m"}}]}]}
        plain = client.messages.create(**kwargs)
        with client.messages.stream(**kwargs) as stream:
            streamed = stream.get_final_message()
        return plain, streamed

    async def talk(client: TestClient[Any, Any]) -> tuple[Any, Any]:
        return await asyncio.to_thread(ask, str(client.make_url("")).rstrip("/"))

    plain, streamed = _serve(manager, talk)
    prompt = len(manager.sent[0].req.input_ids)
    assert manager.sent[0].req.pin_prefix_len == prompt  # the last block is marked: the whole prompt
    for message in (plain, streamed):
        u = message.usage
        assert (u.input_tokens, u.cache_read_input_tokens, u.cache_creation_input_tokens) == (prompt - 14, 3, 11)
        assert u.cache_creation is not None
        assert (u.cache_creation.ephemeral_5m_input_tokens, u.cache_creation.ephemeral_1h_input_tokens) == (11, 0)
    assert plain.content[0].text == streamed.content[0].text == "Hello"
