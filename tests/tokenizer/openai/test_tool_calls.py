"""Pure unit tests of tool calls and chat constraints: validation of tools / tool_choice /
response_format, forced-call schemas, prompts and history rendering, parsing, and the chat
renderer's tool-call responses and stream deltas (no server, no tokenizer)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from runtime.contracts.errors import InvalidRequest
from tokenizer.openai.api import ChatRenderer
from tokenizer.openai.constraints import (
    ANY_JSON,
    ToolChoice,
    ToolPlan,
    chat_constraints,
    check_tool_choice,
    check_tools,
    forced_call_schema,
)
from tokenizer.openai.protocol import plan_chat
from tokenizer.openai.tool_calls import (
    ToolCallStream,
    adapt_to_template,
    messages_as_text,
    messages_for_template,
    parse_tool_calls,
    tool_call_deltas,
    with_tool_prompt,
)

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}
TIME = {"type": "function", "function": {"name": "get_time"}}
NAMES = ["get_weather", "get_time"]
MSG = [{"role": "user", "content": "weather in Paris?"}]


def _chat(**req: Any):
    seen: dict[str, Any] = {}

    def render(messages: list[dict[str, Any]], kwargs: dict[str, Any]) -> list[int]:
        seen.update(messages=messages, kwargs=kwargs)
        return [1, 2, 3]

    plan = plan_chat({"model": "m", "messages": MSG, **req}, "served", 5, context_length=100,
                     render=render)
    return plan, seen


def _out(text: str, reason: str | None = "stop", index: int | None = None) -> dict[str, Any]:
    out = {"text": text, "output_ids": [1], "meta_info": {
        "id": "r", "finish_reason": None if reason is None else {"type": reason},
        "prompt_tokens": 3, "completion_tokens": 1, "cached_tokens": 0}}
    if index is not None:
        out["index"] = index
    return out


# ---------------------------------------------------------------- validation


def test_tools_are_validated_and_normalized() -> None:
    functions = check_tools([WEATHER, TIME])
    assert functions[0]["name"] == "get_weather" and functions[0]["description"]
    assert functions[1] == {"name": "get_time", "parameters": {"type": "object", "properties": {}}}


@pytest.mark.parametrize(("tools", "param"), [
    ("f", "tools"),
    ([{"type": "retrieval"}], "tools[0].type"),
    ([{"type": "function"}], "tools[0].function"),
    ([{"type": "function", "function": {"name": "a b"}}], "tools[0].function.name"),
    ([{"type": "function", "function": {"name": "f", "parameters": {"type": "array"}}}],
     "tools[0].function.parameters"),
    ([{"type": "function", "function": {"name": "f", "parameters": []}}],
     "tools[0].function.parameters"),
    ([TIME, TIME], "tools[1].function.name"),
])
def test_bad_tools_name_the_field(tools: Any, param: str) -> None:
    with pytest.raises(InvalidRequest) as info:
        check_tools(tools)
    assert info.value.param == param


def test_tool_choice() -> None:
    assert check_tool_choice(None, NAMES) == ToolChoice("auto")
    assert check_tool_choice(None, []) == ToolChoice("none")
    assert check_tool_choice("required", NAMES).forced
    named = check_tool_choice({"type": "function", "function": {"name": "get_time"}}, NAMES)
    assert named == ToolChoice("named", "get_time") and named.forced
    for bad in ("sometimes", {"type": "function", "function": {"name": "nope"}},
                {"type": "function"}, 3):
        with pytest.raises(InvalidRequest) as info:
            check_tool_choice(bad, NAMES)
        assert info.value.param == "tool_choice"
    with pytest.raises(InvalidRequest, match="needs tools"):
        check_tool_choice("required", [])


def test_response_format_maps_to_json_schema() -> None:
    assert chat_constraints({"response_format": {"type": "text"}}).grammar == {}
    assert chat_constraints({"response_format": {"type": "json_object"}}).grammar == {
        "json_schema": ANY_JSON}
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    c = chat_constraints({"response_format": {"type": "json_schema", "json_schema": {
        "name": "x", "schema": schema, "strict": True}}})
    assert json.loads(c.grammar["json_schema"]) == schema
    assert c.renames == {"json_schema": "response_format.json_schema.schema"}


@pytest.mark.parametrize(("req", "param"), [
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}},
     "response_format.json_schema.schema"),
    ({"response_format": {"type": "json_schema"}}, "response_format.json_schema"),
    ({"response_format": {"type": "json_schema", "json_schema": {"schema": {}, "strict": 1}}},
     "response_format.json_schema.strict"),
    ({"response_format": {"type": "yaml"}}, "response_format"),
    ({"response_format": "json"}, "response_format"),
    ({"response_format": {"type": "json_object"}, "regex": "a"}, "response_format"),
    ({"tools": [WEATHER], "tool_choice": "required", "ebnf": "root ::= 'a'"}, "tool_choice"),
    ({"tools": [WEATHER], "tool_choice": "required", "response_format": {"type": "json_object"}},
     "tool_choice"),
])
def test_conflicting_or_malformed_constraints(req: dict[str, Any], param: str) -> None:
    with pytest.raises(InvalidRequest) as info:
        chat_constraints(req)
    assert info.value.param == param


def test_none_and_auto_add_no_grammar() -> None:
    assert chat_constraints({"tools": [WEATHER], "tool_choice": "none"}).tools is None
    auto = chat_constraints({"tools": [WEATHER], "regex": "a"})
    assert auto.grammar == {} and auto.tools is not None and not auto.tools.choice.forced
    text_ok = chat_constraints({"tools": [WEATHER], "tool_choice": "required",
                                "response_format": {"type": "text"}})
    assert text_ok.tools is not None and "json_schema" in text_ok.grammar


# ---------------------------------------------------------------- forced-call schemas


def test_named_call_schema() -> None:
    plan = ToolPlan(check_tools([WEATHER, TIME]), ToolChoice("named", "get_weather"))
    schema = forced_call_schema(plan)
    assert schema == {"type": "object", "properties": {
        "name": {"const": "get_weather"}, "arguments": WEATHER["function"]["parameters"]},
        "required": ["name", "arguments"], "additionalProperties": False}
    assert forced_call_schema(ToolPlan(plan.functions, ToolChoice("auto"))) is None


def test_required_call_schema_is_any_of_the_tools_with_defs_hoisted() -> None:
    ref_tool = {"type": "function", "function": {"name": "put", "parameters": {
        "type": "object", "properties": {"item": {"$ref": "#/$defs/Item"}},
        "$defs": {"Item": {"type": "string"}}}}}
    plan = ToolPlan(check_tools([TIME, ref_tool]), ToolChoice("required"))
    schema = forced_call_schema(plan)
    assert schema is not None
    names = [o["properties"]["name"]["const"] for o in schema["anyOf"]]
    assert names == ["get_time", "put"]
    assert schema["$defs"] == {"Item": {"type": "string"}}
    assert "$defs" not in schema["anyOf"][1]["properties"]["arguments"]


def test_forced_plan_puts_the_schema_in_sampling_params() -> None:
    plan, seen = _chat(tools=[WEATHER], tool_choice={"type": "function",
                                                     "function": {"name": "get_weather"}})
    schema = json.loads(plan.body["sampling_params"]["json_schema"])
    assert schema["properties"]["name"] == {"const": "get_weather"}
    assert plan.renames == {"json_schema": "tools"} and plan.tools is not None
    assert seen["kwargs"]["tools"] == [{"type": "function", "function": check_tools([WEATHER])[0]}]


# ---------------------------------------------------------------- prompts and history


def test_tool_prompt_goes_into_the_system_message() -> None:
    functions = check_tools([WEATHER])
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
    tools = [{"type": "function", "function": check_tools([WEATHER])[0]}]
    chatml = "{% for message in messages %}{{ message['content'] }}{% endfor %}"
    messages, kwargs = adapt_to_template(chatml, HISTORY, {"tools": tools, "x": 1})
    assert kwargs == {"x": 1} and "<tool_call>" in messages[0]["content"]
    assert messages[0]["role"] == "system" and messages[-1]["role"] == "user"
    rich = "{% if tools %}{{ tools }}{% endif %}{{ message.tool_calls }}"
    messages, kwargs = adapt_to_template(rich, HISTORY, {"tools": tools})
    assert kwargs == {"tools": tools} and messages[1]["tool_calls"][0]["function"]["arguments"]


def test_history_messages_are_validated_and_kept() -> None:
    _, seen = _chat(messages=HISTORY)
    assert seen["messages"][1]["tool_calls"][0]["function"]["name"] == "get_weather"
    assert seen["messages"][2]["tool_call_id"] == "call_1"
    bad = [*MSG, {"role": "assistant", "content": None, "tool_calls": [{"function": 3}]}]
    with pytest.raises(InvalidRequest) as info:
        _chat(messages=bad)
    assert info.value.param == "messages[1].tool_calls[0]"


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
    '<tool_call>{"name": "get_time", "arguments": {</tool_call>', '{"a": 1}', "",
    '<tool_call>{"name": "nope", "arguments": {}}</tool_call>',
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


@pytest.mark.parametrize("parser,text,calls", [
    ("llama3", LLAMA3, ["get_weather", "get_time"]),
    ("auto", LLAMA3, ["get_weather", "get_time"]),
    ("llama3", LLAMA3.removeprefix("<|python_tag|>"), ["get_weather", "get_time"]),
    ("llama3", QWEN25, []),  # tags are not Llama 3's format
    ("qwen25", QWEN25, ["get_weather", "get_time"]),
    ("hermes", QWEN25, ["get_weather", "get_time"]),
    ("hermes", LLAMA3, []),  # bare JSON is not Hermes' format
    ("auto", QWEN25, ["get_weather", "get_time"]),
    ("llama3", '{"name": "get_time", "parameters": {}}; then some text', []),
])
def test_each_parser_reads_its_family(parser: str, text: str, calls: list[str]) -> None:
    parsed = parse_tool_calls(text, NAMES, parser)
    assert [c.name for c in parsed.calls] == calls
    assert (parsed.content is None) if calls else (parsed.content == text)


@pytest.mark.parametrize("parser", ["llama3", "qwen25", "auto"])
def test_streams_hold_their_family_and_send_it_at_the_end(parser: str) -> None:
    text = LLAMA3 if parser != "qwen25" else QWEN25
    stream = ToolCallStream(NAMES, forced=False, parser=parser)
    sent = "".join(stream.feed(text[:k], False)[0] for k in range(len(text) + 1))
    delta, calls = stream.feed(text, True)
    assert sent + delta == "" and [c.name for c in calls] == ["get_weather", "get_time"]
    plain = ToolCallStream(NAMES, forced=False, parser="llama3")
    assert plain.feed("Paris is sunny.", False)[0] == "Paris is sunny."


def test_stream_sends_content_early_and_holds_calls() -> None:
    text = 'Sure. <tool_call>{"name": "get_time", "arguments": {}}</tool_call>'
    stream = ToolCallStream(NAMES, forced=False)
    sent = [stream.feed(text[:k], False)[0] for k in range(len(text) + 1)]
    assert "".join(sent) == "Sure. "
    delta, calls = stream.feed(text, True)
    assert delta == "" and calls[0].name == "get_time"
    plain = ToolCallStream(NAMES, forced=False)
    pieces = [plain.feed("a <tool", False)[0], plain.feed("a <tooth", False)[0],
              plain.feed("a <tooth!", True)[0]]
    assert pieces == ["a ", "<tooth", "!"] and plain.feed("a <tooth!", True)[1] == []
    bare = ToolCallStream(NAMES, forced=False)
    assert bare.feed("  {", False) == ("", []) and bare.feed('  {"x": 1}', True) == (
        '  {"x": 1}', [])
    forced = ToolCallStream(NAMES, forced=True)
    assert forced.feed("Hello", False) == ("", []) and forced.feed("Hello", True)[0] == "Hello"


def test_call_deltas_are_assembled_by_index() -> None:
    calls = parse_tool_calls('<tool_call>{"name": "get_time", "arguments": {"tz": "UTC"}}'
                             '</tool_call><tool_call>{"name": "get_time", "arguments": {}}'
                             '</tool_call>', NAMES).calls
    deltas = tool_call_deltas(calls)
    assert len(deltas) == 4 and deltas[0]["tool_calls"][0]["function"]["arguments"] == ""
    assembled: dict[int, dict[str, str]] = {}
    for d in deltas:
        for part in d["tool_calls"]:
            entry = assembled.setdefault(part["index"], {"id": "", "name": "", "arguments": ""})
            entry["id"] += part.get("id", "")
            entry["name"] += part["function"].get("name", "")
            entry["arguments"] += part["function"]["arguments"]
    assert assembled[0] == {"id": calls[0].id, "name": "get_time", "arguments": '{"tz": "UTC"}'}
    assert assembled[1]["arguments"] == "{}"


# ---------------------------------------------------------------- chat responses


CALL_TEXT = '{"name": "get_weather", "arguments": {"city": "Paris"}}'


def test_chat_response_with_a_tool_call() -> None:
    plan, _ = _chat(tools=[WEATHER, TIME], tool_choice="required")
    choice = ChatRenderer(plan).final(_out(CALL_TEXT))["choices"][0]
    assert choice["finish_reason"] == "tool_calls" and choice["message"]["content"] is None
    call = choice["message"]["tool_calls"][0]
    assert call["type"] == "function" and call["function"]["name"] == "get_weather"
    assert json.loads(call["function"]["arguments"]) == {"city": "Paris"}
    cut = ChatRenderer(plan).final(_out(CALL_TEXT[:20], "length"))["choices"][0]
    assert cut["finish_reason"] == "length" and cut["message"] == {
        "role": "assistant", "content": CALL_TEXT[:20]}
    plain, _ = _chat()
    assert ChatRenderer(plain).final(_out(CALL_TEXT))["choices"][0]["finish_reason"] == "stop"


def test_chat_stream_with_tool_calls() -> None:
    plan, _ = _chat(tools=[WEATHER], stream=True, n=2)
    r = ChatRenderer(plan)
    chunks = r.start()
    text = "Checking.<tool_call>" + CALL_TEXT + "</tool_call>"
    for k in (5, 12, 30, len(text)):
        chunks += r.chunks(_out(text[:k], None if k < len(text) else "stop", index=0))
    chunks += r.chunks(_out("Hi", "stop", index=1))
    by_index: dict[int, list[dict[str, Any]]] = {0: [], 1: []}
    for c in chunks:
        by_index[c["choices"][0]["index"]].append(c["choices"][0])
    zero = by_index[0]
    assert "".join(c["delta"].get("content") or "" for c in zero) == "Checking."
    calls = [c["delta"]["tool_calls"][0] for c in zero if "tool_calls" in c["delta"]]
    assert calls[0]["function"] == {"name": "get_weather", "arguments": ""} and calls[0]["id"]
    assert json.loads(calls[1]["function"]["arguments"]) == {"city": "Paris"}
    assert [c["finish_reason"] for c in zero if c["finish_reason"]] == ["tool_calls"]
    assert zero[-1]["finish_reason"] == "tool_calls" and zero[-1]["delta"] == {}
    assert [c["finish_reason"] for c in by_index[1] if c["finish_reason"]] == ["stop"]
    assert "".join(c["delta"].get("content") or "" for c in by_index[1]) == "Hi"
