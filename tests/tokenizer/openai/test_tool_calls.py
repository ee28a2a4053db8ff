"""Pure unit tests of tool calls and chat constraints: validation of tools / tool_choice /
response_format (tokenizer/openai/chat.py's parse, tokenizer/core/tools.py), forced-call schemas
(and what their grammars admit), prompts and history rendering (tokenizer/core/tool_prompts.py),
parsing and streamed call events under every chunking (tokenizer/core/tool_calls.py), and the
chat answer's tool-call responses and stream deltas, folded from the core's events (no server,
no tokenizer)."""

from __future__ import annotations

import asyncio
import json
import random
import types
from typing import Any

import pytest

from runtime.contracts.config import ServerConfig
from runtime.contracts.errors import InvalidRequest
from runtime.contracts.sampling import ANY_JSON
from tokenizer.core.choices import ChoiceReader
from tokenizer.core.events import Finished, Tokens, Update, Usage
from tokenizer.core.pipeline import render
from tokenizer.core.request import ChatInput
from tokenizer.core.tool_calls import (
    ArgumentsDelta,
    CallFinished,
    CallStarted,
    ContentDelta,
    ToolCallStream,
    ToolEvent,
    chat_delta,
    parse_for_plan,
    parse_tool_calls,
)
from tokenizer.core.tool_prompts import (
    adapt_to_template,
    messages_as_text,
    messages_for_template,
    with_tool_prompt,
)
from tokenizer.core.tools import EMPTY_PARAMETERS, ToolChoice, ToolPlan, forced_call_schema, tool_plan
from tokenizer.openai.chat import ChatAnswer, ChatRequest, parse_chat

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}
TIME = {"type": "function", "function": {"name": "get_time"}}
NAMES = ["get_weather", "get_time"]
MSG = [{"role": "user", "content": "weather in Paris?"}]


def _chat(**body: Any) -> ChatRequest:
    return parse_chat({"model": "m", "messages": MSG, **body}, ServerConfig(), "served")


def _plan(chat: ChatRequest) -> ToolPlan:
    plan = chat.req.read.tools
    assert plan is not None
    return plan


def _input(chat: ChatRequest) -> ChatInput:
    prompt = chat.req.prompts[0].prompt
    assert isinstance(prompt, ChatInput)
    return prompt


def _functions(*tools: dict[str, Any]) -> list[dict[str, Any]]:
    """The tools as the request's plan holds them."""
    return _plan(_chat(tools=list(tools))).functions


def _error(**body: Any) -> InvalidRequest:
    with pytest.raises(InvalidRequest) as info:
        _chat(**body)
    assert info.value.param is not None and info.value.message.startswith(info.value.param), info.value
    return info.value


def _updates(chat: ChatRequest, choice: int, deltas: list[str], reason: str | None = "stop") -> list[Update]:
    """The core's updates of one choice whose output came in `deltas` (finished with `reason`
    after the last one, unless None)."""
    reader = ChoiceReader(choice, chat.req.read)
    usage = Usage(3, 1, 0)
    updates = []
    for k, delta in enumerate(deltas):
        finished = k == len(deltas) - 1 and reason is not None
        events = [*reader.read(delta, finished), Tokens(choice, [1], None, None, usage)]
        if finished:
            events.append(Finished(choice, {"type": reason}, usage, "r", 0.0))
        updates.append(Update(choice, events))
    return updates


def _final(chat: ChatRequest, text: str, reason: str = "stop") -> dict[str, Any]:
    """The non-streamed chat answer of one output."""
    answer = ChatAnswer(chat)
    for update in _updates(chat, 0, [text], reason):
        answer.update(update)
    return answer.final()


# ---------------------------------------------------------------- validation


def test_tools_are_validated_and_normalized() -> None:
    functions = _functions(WEATHER, TIME)
    assert functions[0]["name"] == "get_weather" and functions[0]["description"]
    assert functions[1] == {"name": "get_time", "parameters": EMPTY_PARAMETERS}


@pytest.mark.parametrize(("tools", "param"), [
    ("f", "tools"),
    ([{"type": "retrieval"}], "tools[0].type"),
    ([{"type": "function"}], "tools[0].function"),
    ([{"type": "function", "function": {"name": "a b"}}], "tools[0].function.name"),
    ([{"type": "function", "function": {"name": "f", "parameters": {"type": "array"}}}],
     "tools[0].function.parameters"),
    ([{"type": "function", "function": {"name": "f", "parameters": []}}],
     "tools[0].function.parameters"),
    ([TIME, TIME], "tools"),
])
def test_bad_tools_name_the_field(tools: Any, param: str) -> None:
    assert _error(tools=tools).param == param


def test_tool_choice() -> None:
    assert _plan(_chat(tools=[WEATHER, TIME])).choice == ToolChoice("auto")
    assert _chat().req.read.tools is None  # no tools: choice none, nothing parsed
    assert _plan(_chat(tools=[WEATHER, TIME], tool_choice="required")).choice.forced
    named = _plan(_chat(tools=[WEATHER, TIME], tool_choice={"type": "function", "function": {"name": "get_time"}}))
    assert named.choice == ToolChoice("named", "get_time") and named.choice.forced
    unknown = {"type": "function", "function": {"name": "nope"}}
    for bad, param in (("sometimes", "tool_choice"), (unknown, "tool_choice"),
                       ({"type": "function"}, "tool_choice.function"), (3, "tool_choice")):
        assert _error(tools=[WEATHER, TIME], tool_choice=bad).param == param
    err = _error(tool_choice="required")
    assert err.param == "tool_choice" and "needs tools" in err.message
    assert tool_plan(_functions(TIME), ToolChoice("none")) is None


def test_response_format_maps_to_json_schema() -> None:
    assert "json_schema" not in _chat(response_format={"type": "text"}).req.prompts[0].sampling
    assert _chat(response_format={"type": "json_object"}).req.prompts[0].sampling["json_schema"] == ANY_JSON
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    req = _chat(response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": schema,
                                                                         "strict": True}}).req
    assert json.loads(req.prompts[0].sampling["json_schema"]) == schema
    assert req.names["json_schema"] == "response_format.json_schema.schema"


@pytest.mark.parametrize(("req", "param"), [
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}},
     "response_format.json_schema.schema"),
    ({"response_format": {"type": "json_schema"}}, "response_format.json_schema"),
    ({"response_format": {"type": "json_schema", "json_schema": {"schema": {}, "strict": 1}}},
     "response_format.json_schema.strict"),
    ({"response_format": {"type": "yaml"}}, "response_format.type"),
    ({"response_format": "json"}, "response_format"),
    ({"response_format": {"type": "json_object"}, "regex": "a"}, "response_format"),
    ({"tools": [WEATHER], "tool_choice": "required", "ebnf": "root ::= 'a'"}, "tool_choice"),
    ({"tools": [WEATHER], "tool_choice": "required", "response_format": {"type": "json_object"}},
     "tool_choice"),
])
def test_conflicting_or_malformed_constraints(req: dict[str, Any], param: str) -> None:
    assert _error(**req).param == param


def test_none_and_auto_add_no_grammar() -> None:
    assert _chat(tools=[WEATHER], tool_choice="none").req.read.tools is None
    auto = _chat(tools=[WEATHER], regex="a").req
    assert "json_schema" not in auto.prompts[0].sampling and auto.prompts[0].sampling["regex"] == "a"
    assert auto.read.tools is not None and not auto.read.tools.choice.forced
    text_ok = _chat(tools=[WEATHER], tool_choice="required", response_format={"type": "text"}).req
    assert text_ok.read.tools is not None and "json_schema" in text_ok.prompts[0].sampling


# ---------------------------------------------------------------- forced-call schemas


def test_named_call_schema() -> None:
    plan = ToolPlan(_functions(WEATHER, TIME), ToolChoice("named", "get_weather"))
    schema = forced_call_schema(plan)
    assert schema == {"type": "object", "properties": {
        "name": {"const": "get_weather"}, "arguments": WEATHER["function"]["parameters"]},
        "required": ["name", "arguments"], "additionalProperties": False}
    assert forced_call_schema(ToolPlan(plan.functions, ToolChoice("auto"))) is None


def test_required_call_schema_is_any_of_the_tools_with_defs_hoisted() -> None:
    ref_tool = {"type": "function", "function": {"name": "put", "parameters": {
        "type": "object", "properties": {"item": {"$ref": "#/$defs/Item"}},
        "$defs": {"Item": {"type": "string"}}}}}
    for parallel in (False, True):
        plan = ToolPlan(_functions(TIME, ref_tool), ToolChoice("required"), parallel)
        schema = forced_call_schema(plan)
        assert schema is not None
        call = schema["items"] if parallel else schema
        assert (schema["type"], schema["minItems"]) == ("array", 1) if parallel else "items" not in schema
        names = [o["properties"]["name"]["const"] for o in call["anyOf"]]
        assert names == ["get_time", "put"]
        assert schema["$defs"] == {"Item": {"type": "string"}}
        assert "$defs" not in call["anyOf"][1]["properties"]["arguments"]


class _Templater:
    """What the pipeline's `render` reads of a TokenizerManager: a template that takes `tools`
    and `tool_calls` itself, and an apply_chat_template that records what it is given."""

    def __init__(self) -> None:
        self.tokenizer = types.SimpleNamespace(chat_template="{{ tools }}{{ message.tool_calls }}")
        self.seen: dict[str, Any] = {}

        async def encode_texts(texts: list[str], add_special_tokens: bool = True) -> list[list[int]]:
            return [[1, 2, 3] for _ in texts]

        self.encoder = types.SimpleNamespace(encode_texts=encode_texts)

    def apply_chat_template(self, messages: list[dict[str, Any]], tools: Any = None, **variables: Any) -> str:
        self.seen.update(messages=messages, tools=tools, variables=variables)
        return "prompt"


def _rendered(chat: ChatRequest) -> dict[str, Any]:
    """What the chat template was given for the request's prompt."""
    tm = _Templater()
    assert asyncio.run(render(tm, _input(chat))).ids == [1, 2, 3]  # type: ignore[arg-type]
    return tm.seen


def test_forced_plan_puts_the_schema_in_sampling_params() -> None:
    chat = _chat(tools=[WEATHER], tool_choice={"type": "function", "function": {"name": "get_weather"}})
    schema = json.loads(chat.req.prompts[0].sampling["json_schema"])
    assert schema["properties"]["name"] == {"const": "get_weather"}
    assert chat.req.names["json_schema"] == "tools" and chat.req.read.tools is not None
    assert _rendered(chat)["tools"] == [{"type": "function", "function": _functions(WEATHER)[0]}]


# ---------------------------------------------------------------- prompts and history


def test_tool_prompt_goes_into_the_system_message() -> None:
    functions = _functions(WEATHER)
    added = with_tool_prompt(MSG, functions)
    assert added[0]["role"] == "system" and "<tool_call>" in added[0]["content"]
    assert '"get_weather"' in added[0]["content"] and added[1:] == MSG
    merged = with_tool_prompt([{"role": "system", "content": "Be brief."}, *MSG], functions)
    assert merged[0]["content"].startswith("Be brief.\n\n") and len(merged) == 2


HISTORY: list[dict[str, Any]] = [
    *MSG,
    {"role": "assistant", "content": "", "tool_calls": [
        {"id": "call_1", "type": "function",
         "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}},
        {"id": "call_2", "type": "function", "function": {"name": "get_time", "arguments": {}}}]},
    {"role": "tool", "content": "18C", "tool_call_id": "call_1"},
    {"role": "tool", "content": "noon", "tool_call_id": "call_2"},
]


def test_history_as_text() -> None:
    text = messages_as_text(HISTORY)
    assert [m["role"] for m in text] == ["user", "assistant", "user"]
    assert text[1]["content"] == (
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
        '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>')
    assert text[2]["content"] == ("<tool_response>\n18C\n</tool_response>\n"
                                  "<tool_response>\nnoon\n</tool_response>")


def test_history_for_a_template_with_tool_support() -> None:
    native = messages_for_template(HISTORY)
    assert native[1]["tool_calls"][0]["function"]["arguments"] == {"city": "Paris"}
    assert native[2] == HISTORY[2]


def test_adapt_to_template() -> None:
    tools = [{"type": "function", "function": _functions(WEATHER)[0]}]
    chatml = "{% for message in messages %}{{ message['content'] }}{% endfor %}"
    messages, kwargs = adapt_to_template(chatml, HISTORY, {"tools": tools, "x": 1})
    assert kwargs == {"x": 1} and "<tool_call>" in messages[0]["content"]
    assert messages[0]["role"] == "system" and messages[-1]["role"] == "user"
    rich = "{% if tools %}{{ tools }}{% endif %}{{ message.tool_calls }}"
    messages, kwargs = adapt_to_template(rich, HISTORY, {"tools": tools})
    assert kwargs == {"tools": tools} and messages[1]["tool_calls"][0]["function"]["arguments"]


def test_history_messages_are_validated_and_kept() -> None:
    chat = _chat(messages=HISTORY)
    for messages in (_input(chat).messages, _rendered(chat)["messages"]):
        assert messages[1]["tool_calls"][0]["function"]["name"] == "get_weather"
        assert messages[2]["tool_call_id"] == "call_1"
    bad = [*MSG, {"role": "assistant", "content": None, "tool_calls": [{"function": 3}]}]
    assert _error(messages=bad).param == "messages[1].tool_calls[0].function"


# ---------------------------------------------------------------- parsing


def test_parse_blocks_bare_json_and_plain_text() -> None:
    text = ('Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}'
            '\n</tool_call>\n<tool_call>{"name": "get_time", "parameters": "{}"}</tool_call>')
    parsed = parse_tool_calls(text, NAMES)
    assert [c.name for c in parsed.calls] == ["get_weather", "get_time"]
    assert json.loads(parsed.calls[0].arguments) == {"city": "Paris"}
    assert parsed.calls[1].arguments == "{}" and parsed.content == "Let me check.\n\n"
    assert parsed.calls[0].id.startswith("call_") and parsed.calls[0].id != parsed.calls[1].id
    bare = parse_tool_calls(' {"name": "get_time", "arguments": {}} ', NAMES)
    assert bare.content is None and bare.calls[0].name == "get_time"
    unclosed = parse_tool_calls('<tool_call>{"name": "get_time", "arguments": {}}', NAMES)
    assert unclosed.content is None and len(unclosed.calls) == 1


@pytest.mark.parametrize("text", [
    "Hello there", '{"name": "unknown", "arguments": {}}', '{"name": "get_time", "arguments": 3}',
    '{"a": 1}', "", "[1, 2]", '{"name": "get_time", "arguments": "not an object"}',
    '<tool_call>{"name": "nope", "arguments": {}}</tool_call>', "<tool_caller> is no tag",
    '<|python_tag|>print("hi")', '{"arguments": {}, "name": "get_time"}',
])
def test_unparseable_outputs_stay_content(text: str) -> None:
    parsed = parse_tool_calls(text, NAMES)
    assert parsed.calls == [] and parsed.content == text


# Recorded shapes: Llama-3.1-8B-Instruct (JSON calls, several joined by ';', after <|python_tag|>
# when special tokens are kept) and Qwen2.5-7B-Instruct (Hermes blocks, one per call).
LLAMA3 = ('<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}; '
          '{"name": "get_time", "parameters": {}}')
QWEN25 = ('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
          '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>')
# What the forced grammars write: one call object, or (required, parallel) an array of calls.
FORCED_ONE = '{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}'
FORCED_MANY = ('[{"name": "get_weather", "arguments": {"city": "Paris"}}, '
               '{"name": "get_time", "arguments": {"zone": "CET"}}]')
PARIS, EMPTY = ("get_weather", '{"city": "Paris"}'), ("get_time", "{}")


@pytest.mark.parametrize("parser,text,calls", [
    ("llama3", LLAMA3, ["get_weather", "get_time"]),
    ("auto", LLAMA3, ["get_weather", "get_time"]),
    ("llama3", LLAMA3.removeprefix("<|python_tag|>"), ["get_weather", "get_time"]),
    ("llama3", QWEN25, []),  # tags are not Llama 3's format
    ("qwen25", QWEN25, ["get_weather", "get_time"]),
    ("hermes", QWEN25, ["get_weather", "get_time"]),
    ("hermes", LLAMA3, []),  # bare JSON is not Hermes' format
    ("auto", QWEN25, ["get_weather", "get_time"]),
    ("auto", FORCED_MANY, ["get_weather", "get_time"]),
])
def test_each_parser_reads_its_family(parser: str, text: str, calls: list[str]) -> None:
    parsed = parse_tool_calls(text, NAMES, parser)
    assert [c.name for c in parsed.calls] == calls
    assert (parsed.content is None) if calls else (parsed.content == text)


# (parser, text, max_calls, content, [(name, arguments)]): representative outputs, each also
# streamed in every chunking below. Arguments are the raw text the model wrote.
CASES: list[tuple[str, str, int | None, str | None, list[tuple[str, str]]]] = [
    ("qwen25", QWEN25, None, None, [PARIS, EMPTY]),
    ("hermes", QWEN25, 1, None, [PARIS]),  # parallel_tool_calls false: the first call only
    ("llama3", LLAMA3, None, None, [PARIS, EMPTY]),
    ("auto", LLAMA3, None, None, [PARIS, EMPTY]),
    ("auto", FORCED_ONE, None, None, [("get_weather", '{"city": "Paris", "unit": "celsius"}')]),
    ("auto", FORCED_MANY, None, None, [PARIS, ("get_time", '{"zone": "CET"}')]),
    ("auto", FORCED_MANY, 1, None, [PARIS]),
    ("auto", 'Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n'
     '</tool_call>\nOne moment.', None, "Let me check.\n\nOne moment.", [PARIS]),
    ("auto", '<tool_call>{"name": "get_time", "parameters": "{\\"zone\\": \\"UTC\\"}"}</tool_call>',
     None, None, [("get_time", '{"zone": "UTC"}')]),
    ("auto", '<tool_call>{"name":"get_weather","arguments":{"city":"a}\\"</tool_call>{[","n":[1,{}]}}'
     '</tool_call>', None, None, [("get_weather", '{"city":"a}\\"</tool_call>{[","n":[1,{}]}')]),
    ("auto", '  {"name": "get_weather", "arguments": {"city": "Pa', None, None,
     [("get_weather", '{"city": "Pa')]),  # cut by max_tokens: the arguments so far
    ("auto", '<tool_call>{"name": "get_time", "arguments": {</tool_call> then text', None, " then text",
     [("get_time", "{")]),
    ("llama3", '{"name": "get_time", "parameters": {}}; then some text', None, "; then some text", [EMPTY]),
    # marker-like prefixes that turn out to be text
    ("auto", "<tool_caller> and <|python_tags|>, {json} and [lists]", None,
     "<tool_caller> and <|python_tags|>, {json} and [lists]", []),
    ("auto", '{"name": "get_weather_now", "arguments": {}} is not a tool', None,
     '{"name": "get_weather_now", "arguments": {}} is not a tool', []),
    ("auto", '<tool_call>{"name": "nope"}</tool_call> <tool_call>{"name": "get_time"}</tool_call>', None,
     '<tool_call>{"name": "nope"}</tool_call> ', [EMPTY]),
    ("auto", '<tool_call>{"name": "get_time", "arguments": "[1]"}</tool_call>', None,
     '<tool_call>{"name": "get_time", "arguments": "[1]"}</tool_call>', []),
]


def _chunkings(n: int) -> list[list[int]]:
    """Cut points for feeding `n` characters: every prefix, fixed steps, every split in two, and
    random splits (seeded). Each ends at n."""
    cuts = [list(range(1, n + 1))] + [list(range(s, n, s)) + [n] for s in (2, 3, 7)]
    cuts += [[k, n] for k in range(n)]
    rng = random.Random(n)
    cuts += [sorted(set(rng.sample(range(1, n), min(n - 1, rng.randint(1, 12))))) + [n] for _ in range(30) if n > 1]
    return cuts


def _stream(parser: str, text: str, max_calls: int | None, cuts: list[int],
            push: bool = False) -> list[list[ToolEvent]]:
    """The events of each feed: the cumulative text (`events`), or only what is new (`push`)."""
    stream = ToolCallStream(NAMES, False, parser, max_calls=max_calls)
    if not push:
        return [stream.events(text[:k], k == len(text)) for k in cuts or [0]]
    starts = [0, *cuts]
    return [stream.push(text[a:b], b == len(text)) for a, b in zip(starts, cuts or [0])]


def _joined(feeds: list[list[ToolEvent]]) -> tuple[str, list[tuple[str, str]]]:
    """Content and calls as a client assembles them, checking the events' order on the way."""
    content, calls, ids, done = "", [], {}, set()
    for event in (e for feed in feeds for e in feed):
        if isinstance(event, ContentDelta):
            content += event.text
        elif isinstance(event, CallStarted):
            assert event.index == len(calls) and event.id.startswith("call_")
            calls.append([event.name, ""])
            ids[event.index] = event.id
        elif isinstance(event, ArgumentsDelta):
            assert event.index in ids and event.index not in done and event.text
            calls[event.index][1] += event.text
        else:
            assert event.call.id == ids[event.index] and event.index not in done
            assert (event.call.name, event.call.arguments) == tuple(calls[event.index])
            done.add(event.index)
    assert done == set(ids)  # every call finishes by the end of the output
    return content, [(name, args) for name, args in calls]


@pytest.mark.parametrize("parser,text,max_calls,content,calls", CASES)
def test_streamed_events_join_to_the_parse_in_every_chunking(
        parser: str, text: str, max_calls: int | None, content: str | None,
        calls: list[tuple[str, str]]) -> None:
    parsed = parse_tool_calls(text, NAMES, parser, max_calls=max_calls)
    assert parsed.content == content and [(c.name, c.arguments) for c in parsed.calls] == calls
    for cuts in _chunkings(len(text)):
        for push in (False, True):
            assert _joined(_stream(parser, text, max_calls, cuts, push)) == (content or "", calls), (cuts, push)


PIECES = ["<tool_call>", "</tool_call>", "{", "}", "[", "]", '"name"', ":", ",", '"get_time"', '"arguments"',
          '"parameters"', " ", "\n", ";", '"', "\\", "x", "<|python_tag|>", '"{}"', "<", '"a"',
          '{"name": "get_time", "arguments": ', '"{\\"a\\": 1}"']


@pytest.mark.parametrize("parser", ["auto", "hermes", "llama3"])
def test_random_outputs_stream_as_they_parse(parser: str) -> None:
    """Seeded random texts made of the formats' pieces: the stream fed every prefix, and in
    random chunks, joins to the parse; an output without calls is all content."""
    rng = random.Random(parser)
    for _ in range(150):
        text = "".join(rng.choice(PIECES) for _ in range(rng.randint(0, 14)))
        for max_calls in (None, 1):
            parsed = parse_tool_calls(text, NAMES, parser, max_calls=max_calls)
            assert parsed.calls or parsed.content == text
            want = (parsed.content or "", [(c.name, c.arguments) for c in parsed.calls])
            n = len(text)
            random_cuts = sorted(set(rng.sample(range(1, n), min(n - 1, 4)))) + [n] if n > 1 else [n]
            for cuts in (list(range(1, n + 1)), random_cuts):
                assert _joined(_stream(parser, text, max_calls, cuts)) == want, (text, cuts)
                assert _joined(_stream(parser, text, max_calls, cuts, push=True)) == want, (text, cuts)


@pytest.mark.parametrize("parser,text", [(p, t) for p, t, _, _, calls in CASES if calls])
def test_a_call_is_named_before_its_arguments_are_complete(parser: str, text: str) -> None:
    """Fed token by token (here: character by character), each call's CallStarted comes in an
    earlier feed than its CallFinished, except calls without arguments or with arguments in a
    JSON string (sent whole); object arguments arrive in several fragments."""
    feeds = _stream(parser, text, None, list(range(1, len(text) + 1)))
    started = {e.index: k for k, feed in enumerate(feeds) for e in feed if isinstance(e, CallStarted)}
    finished = {e.index: (k, e.call) for k, feed in enumerate(feeds) for e in feed if isinstance(e, CallFinished)}
    fragments = [e.index for feed in feeds for e in feed if isinstance(e, ArgumentsDelta)]
    for index, (k, call) in finished.items():
        whole = len(call.arguments) < 3 or '"parameters": "' in text or '"arguments": "' in text
        assert started[index] < k or whole, call
        assert fragments.count(index) > 1 or whole, call


@pytest.mark.parametrize("parser", ["auto", "hermes", "llama3"])
def test_plain_text_is_sent_as_it_comes(parser: str) -> None:
    """Nothing but a possible marker at the end is held: a partial `<tool_call>` (auto, hermes),
    and at the start a partial `<|python_tag|>`, `{` or `[` (auto, llama3) until decided."""
    text = "Paris is sunny, {mostly} [today] <b>bold</b> <tool"
    stream = ToolCallStream(NAMES, False, parser)
    sent = ""
    for k in range(1, len(text) + 1):
        sent += "".join(e.text for e in stream.events(text[:k], False) if isinstance(e, ContentDelta))
        held = len(text[:k]) - len(sent)
        if parser != "llama3" and text[:k].endswith(("<", "<t", "<to", "<too", "<tool")):
            assert text[:k].endswith(text[len(sent):k]) and held <= 5
        else:
            assert held == 0, text[:k]
    lead = ToolCallStream(NAMES, False, parser)
    pieces = [lead.events(t, False) for t in ("<|py", "<|python_ta", "<|python_tax")]
    held_tag = parser != "hermes"
    assert [bool(p) for p in pieces] == ([False, False, True] if held_tag else [True, True, True])
    brace = ToolCallStream(NAMES, False, parser)
    decided = [brace.events(t, False) for t in ("{", '{"', '{"na', '{"nax')]
    assert [bool(p) for p in decided] == ([False, False, False, True] if held_tag else [True] * 4)


def test_blank_content_beside_calls_is_none_and_never_sent() -> None:
    stream = ToolCallStream(NAMES)
    events = [stream.events(t, False) for t in ("\n", "\n  ")] + [stream.events("\n  " + QWEN25, True)]
    assert not any(isinstance(e, ContentDelta) for feed in events for e in feed)
    whitespace = ToolCallStream(NAMES)
    assert whitespace.events("  ", False) == [] and whitespace.events("  ", True) == [ContentDelta("  ")]


def test_feed_sends_content_now_and_calls_at_the_end() -> None:
    text = 'Sure. <tool_call>{"name": "get_time", "arguments": {}}</tool_call>'
    stream = ToolCallStream(NAMES)
    sent = [stream.feed(text[:k], False) for k in range(len(text) + 1)]
    assert "".join(delta for delta, _ in sent) == "Sure. " and not any(calls for _, calls in sent)
    delta, calls = stream.feed(text, True)
    assert delta == "" and [c.name for c in calls] == ["get_time"]
    plain = ToolCallStream(NAMES)
    pieces = [plain.feed("a <tool", False)[0], plain.feed("a <tooth", False)[0],
              plain.feed("a <tooth!", True)[0]]
    assert pieces == ["a ", "<tooth", "!"]


def test_plan_streams_use_its_choice_and_parallel_flag() -> None:
    plan = _plan(_chat(tools=[WEATHER, TIME], tool_choice="required", parallel_tool_calls=False))
    assert not plan.parallel
    parsed = parse_for_plan(FORCED_MANY, plan, "hermes")  # forced: read as bare JSON
    assert [c.name for c in parsed.calls] == ["get_weather"]
    ids = iter(["call_a", "call_b"])
    stream = ToolCallStream.for_plan(plan, "hermes", new_id=lambda: next(ids))
    assert [e.id for e in stream.events(FORCED_MANY, True) if isinstance(e, CallStarted)] == ["call_a"]


def test_chat_deltas() -> None:
    assert chat_delta(CallStarted(1, "call_x", "f")) == {"tool_calls": [{
        "index": 1, "id": "call_x", "type": "function", "function": {"name": "f", "arguments": ""}}]}
    assert chat_delta(ArgumentsDelta(1, '{"a')) == {"tool_calls": [{"index": 1, "function": {"arguments": '{"a'}}]}
    assert chat_delta(ContentDelta("x")) is None


# ---------------------------------------------------------------- what the forced grammars admit


def _accepts(schema: dict[str, Any] | None, text: str) -> bool:
    xgr = pytest.importorskip("xgrammar")
    from xgrammar.testing import _is_grammar_accept_string

    return bool(_is_grammar_accept_string(xgr.Grammar.from_json_schema(json.dumps(schema)), text))


ONE_CALL = '{"name": "get_time", "arguments": {"zone": "CET"}}'
TWO_CALLS = f'[{ONE_CALL}, {FORCED_ONE}]'
WEATHER_STRICT = {"type": "function", "function": {
    "name": "get_weather", "parameters": {"type": "object", "properties": {
        "city": {"type": "string"}, "unit": {"type": "string"}}, "required": ["city"]}}}
TIME_STRICT = {"type": "function", "function": {"name": "get_time", "parameters": {
    "type": "object", "properties": {"zone": {"type": "string"}}, "required": ["zone"]}}}


@pytest.mark.parametrize("choice,parallel,accepted,refused", [
    ("required", True, [f"[{ONE_CALL}]", TWO_CALLS], ["[]", ONE_CALL, '[{"name": "nope", "arguments": {}}]']),
    ("required", False, [ONE_CALL, FORCED_ONE], [TWO_CALLS, f"[{ONE_CALL}]", f"{ONE_CALL}; {ONE_CALL}"]),
    ("get_time", True, [ONE_CALL], [TWO_CALLS, FORCED_ONE, f"[{ONE_CALL}]"]),
    ("get_time", False, [ONE_CALL], [TWO_CALLS, FORCED_ONE]),
])
def test_forced_grammars_admit_one_or_several_calls(choice: str, parallel: bool, accepted: list[str],
                                                    refused: list[str]) -> None:
    """required: one or more calls (one with parallel_tool_calls false); a named function:
    exactly one call of it. What they admit parses back into that many calls."""
    tool_choice: Any = choice if choice == "required" else {"type": "function", "function": {"name": choice}}
    chat = _chat(tools=[WEATHER_STRICT, TIME_STRICT], tool_choice=tool_choice, parallel_tool_calls=parallel)
    schema = json.loads(chat.req.prompts[0].sampling["json_schema"])
    for text in accepted:
        assert _accepts(schema, text), text
        assert parse_for_plan(text, _plan(chat), "auto").calls
    for text in refused:
        assert not _accepts(schema, text), text


def test_parallel_tool_calls_must_be_a_boolean() -> None:
    assert _error(tools=[WEATHER], parallel_tool_calls="no").param == "parallel_tool_calls"
    assert _plan(_chat(tools=[WEATHER])).parallel


# ---------------------------------------------------------------- chat responses


CALL_TEXT = '{"name": "get_weather", "arguments": {"city": "Paris"}}'


def test_chat_response_with_a_tool_call() -> None:
    chat = _chat(tools=[WEATHER, TIME], tool_choice="required")
    choice = _final(chat, CALL_TEXT)["choices"][0]
    assert choice["finish_reason"] == "tool_calls" and choice["message"]["content"] is None
    call = choice["message"]["tool_calls"][0]
    assert call["type"] == "function" and call["function"]["name"] == "get_weather"
    assert call["id"].startswith("call_") and json.loads(call["function"]["arguments"]) == {"city": "Paris"}
    cut = _final(chat, CALL_TEXT[:20], "length")["choices"][0]
    assert cut["finish_reason"] == "length" and cut["message"] == {
        "role": "assistant", "content": CALL_TEXT[:20]}
    assert _final(_chat(), CALL_TEXT)["choices"][0]["finish_reason"] == "stop"


def test_chat_stream_with_tool_calls() -> None:
    chat = _chat(tools=[WEATHER], stream=True, n=2)
    answer = ChatAnswer(chat)
    chunks = answer.start()
    text = "Checking.<tool_call>" + CALL_TEXT + "</tool_call>"
    cuts = [5, 12, 30, 50, 58, 65, len(text)]
    deltas = [text[a:b] for a, b in zip([0, *cuts], cuts)]
    for update in _updates(chat, 0, deltas) + _updates(chat, 1, ["Hi"]):
        chunks += answer.update(update)
    by_index: dict[int, list[dict[str, Any]]] = {0: [], 1: []}
    for c in chunks:
        by_index[c["choices"][0]["index"]].append(c["choices"][0])
    zero = by_index[0]
    assert zero[0]["delta"] == {"role": "assistant", "content": ""}  # the role first
    assert "".join(c["delta"].get("content") or "" for c in zero) == "Checking."
    calls = [c["delta"]["tool_calls"][0] for c in zero if "tool_calls" in c["delta"]]
    assert calls[0] == {"index": 0, "id": calls[0]["id"], "type": "function",
                        "function": {"name": "get_weather", "arguments": ""}}
    fragments = [c["function"]["arguments"] for c in calls[1:]]
    assert len(fragments) == 3 and all("id" not in c and "name" not in c["function"] for c in calls[1:])
    plain = _final(chat, text)["choices"][0]["message"]["tool_calls"][0]
    assert "".join(fragments) == plain["function"]["arguments"] == '{"city": "Paris"}'
    assert [c["finish_reason"] for c in zero if c["finish_reason"]] == ["tool_calls"]
    assert zero[-1]["finish_reason"] == "tool_calls" and zero[-1]["delta"] == {}
    assert [c["finish_reason"] for c in by_index[1] if c["finish_reason"]] == ["stop"]
    assert "".join(c["delta"].get("content") or "" for c in by_index[1]) == "Hi"


def test_chat_calls_cut_by_length_keep_the_reason() -> None:
    chat = _chat(tools=[WEATHER], tool_choice="required")
    cut = CALL_TEXT[:45]  # inside the arguments: a call, with the arguments so far
    choice = _final(chat, cut, "length")["choices"][0]
    assert choice["finish_reason"] == "length"
    assert choice["message"]["tool_calls"][0]["function"]["arguments"] == cut[cut.index("{", 1):]
