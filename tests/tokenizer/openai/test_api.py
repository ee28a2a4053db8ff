"""Pure unit tests of the OpenAI mapping (tokenizer/openai/completions.py, chat.py, common.py):
bodies -> the typed request, the core's events -> responses and stream chunks (no server, no
tokenizer)."""

from __future__ import annotations

import asyncio
import types
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from runtime.contracts.config import ServerConfig
from runtime.contracts.errors import InvalidRequest
from tokenizer.core.events import Event, Finished, InputLogprobs, TextDelta, Tokens, Update, Usage
from tokenizer.core.request import ChatInput, Logprobs
from tokenizer.http_server import create_app, echo_texts
from tokenizer.labels import InternalRids
from tokenizer.limits import RequestLimits
from tokenizer.manager import TokenizerManager
from tokenizer.openai.chat import ChatAnswer, ChatRequest, parse_chat
from tokenizer.openai.common import usage
from tokenizer.openai.completions import CompletionAnswer, CompletionRequest, parse_completion
from tokenizer.server_state import ServerState

CAP = 5
CONTEXT = 100
USER = [{"role": "user", "content": "x"}]


def _completion(**body: Any) -> CompletionRequest:
    return parse_completion({"model": "m", **body}, "served")


def _chat(**body: Any) -> ChatRequest:
    return parse_chat({"model": "m", **body}, ServerConfig(), "served")


def _manager() -> TokenizerManager:
    """Only what `_prepare` reads: a context of 100 tokens, at most 5 top logprobs."""
    tm = object.__new__(TokenizerManager)
    tm._rids = InternalRids()
    tm.config = ServerConfig(model_path="/m")
    tm.limits = RequestLimits(vocab_size=1000, context_length=CONTEXT, kv_total=None, max_n=4, max_top_logprobs=CAP)
    return tm


def _choice(i: int, text: str, tokens: int, reason: str | None = "length") -> Update:
    """One update of choice `i`: `text` (new), `tokens` completion tokens so far."""
    usage_ = Usage(3, tokens, 2)
    events: list[Event] = [TextDelta(i, text)] if text else []
    events.append(Tokens(i, list(range(tokens)), None, None, usage_))
    if reason is not None:
        events.append(Finished(i, {"type": reason}, usage_, "r", 0.0))
    return Update(i, events)


def test_completion_body_shapes() -> None:
    parsed = _completion(prompt="hi", max_tokens=5, temperature=0, top_k=3, min_tokens=1, n=2)
    prompt = parsed.req.prompts[0]
    assert prompt.prompt == "hi" and parsed.req.n == 2 and parsed.header.id.startswith("cmpl-")
    assert prompt.sampling == {"max_new_tokens": 5, "temperature": 0, "top_k": 3, "min_new_tokens": 1, "n": 2}
    assert prompt.rid == parsed.header.id.removeprefix("cmpl-") and prompt.field == "prompt"
    assert _completion(prompt="hi").req.prompts[0].sampling["max_new_tokens"] == 16
    texts = _completion(prompt=["a", "b"]).req
    assert [p.prompt for p in texts.prompts] == ["a", "b"] and texts.batch
    assert _completion(prompt=[1, 2]).req.prompts[0].prompt == [1, 2]
    batch = _completion(prompt=[[1], [2, 3]], echo=True, logprobs=2)
    assert [p.prompt for p in batch.req.prompts] == [[1], [2, 3]] and len(batch.req.prompts) == 2
    assert batch.echo == [[1], [2, 3]]
    assert batch.req.prompts[0].logprobs == Logprobs(enabled=True, start_len=0, top_n=2, with_text=True)

    async def decode(seqs: list[list[int]], skip_special_tokens: bool = False) -> list[str]:
        return [f"<{len(ids)}>" for ids in seqs]

    server = types.SimpleNamespace(manager=lambda: types.SimpleNamespace(encoder=types.SimpleNamespace(decode=decode)))
    assert asyncio.run(echo_texts(server, batch)) == ["<1>", "<2>"]  # type: ignore[arg-type]


def test_chat_body_defaults_to_the_rest_of_the_context() -> None:
    chat = _chat(messages=[{"role": "developer", "content": [{"type": "text", "text": "x"}]}])
    prompt = chat.req.prompts[0]
    assert isinstance(prompt.prompt, ChatInput) and prompt.prompt.messages == [{"role": "system", "content": "x"}]
    assert chat.req.default_max_tokens and "max_new_tokens" not in prompt.sampling
    rendered = _manager()._prepare(chat.req, prompt, [1, 2, 3])  # the chat rendered to 3 tokens
    assert rendered.req.sampling_params.max_new_tokens == CONTEXT - 3
    chat = _chat(messages=USER, max_tokens=9, max_completion_tokens=4, logprobs=True, top_logprobs=2, stream=True,
                 stream_options={"include_usage": True})
    prompt = chat.req.prompts[0]
    assert prompt.sampling["max_new_tokens"] == 4 and not chat.req.default_max_tokens
    assert prompt.logprobs.top_n == 2 and chat.include_usage and chat.req.stream


@pytest.mark.parametrize(("req", "param"), [
    ({"prompt": ""}, "prompt"), ({"prompt": [1, "a"]}, "prompt[1]"),
    ({"prompt": "x", "echo": 1}, "echo"),
    ({"prompt": "x", "logprobs": 1025}, "logprobs"),
    ({"prompt": "x", "bogus": 1}, "bogus"), ({"prompt": "x", "model": 3}, "model"),
    ({"prompt": "x", "stream": True, "stream_options": {"x": 1}}, "stream_options.x"),
    ({"prompt": "x", "stream_options": {"include_usage": True}}, "stream_options"),
])
def test_completion_rejections_name_the_field(req: dict[str, Any], param: str) -> None:
    with pytest.raises(InvalidRequest) as info:
        _completion(**req)
    assert info.value.param == param and info.value.message.startswith(param + ":")


@pytest.mark.parametrize(("req", "param"), [
    ({"messages": "hi"}, "messages"), ({"messages": [{"role": "user"}]}, "messages[0].content"),
    ({"messages": USER, "response_format": {"type": "json_schema"}}, "response_format.json_schema"),
    ({"messages": USER, "tool_choice": "required"}, "tool_choice"),
    ({"messages": USER, "logprobs": "yes"}, "logprobs"),
    ({"messages": USER, "top_logprobs": 2}, "top_logprobs"),
])
def test_chat_rejections_name_the_field(req: dict[str, Any], param: str) -> None:
    with pytest.raises(InvalidRequest) as info:
        _chat(**req)
    assert info.value.param == param and info.value.message.startswith(param)


def test_manager_errors_are_renamed() -> None:
    """The manager names SamplingParams' fields; each protocol's request renames them."""
    chat, completion = _chat(messages=USER).req, _completion(prompt="x").req
    exc = InvalidRequest.field("max_new_tokens", "must be >= 0").renamed(chat.names)
    assert exc.param == "max_tokens" and exc.message == "max_tokens: must be >= 0"
    assert InvalidRequest.field("text", "bad text").renamed(completion.names).param == "prompt"
    assert InvalidRequest.field("input_ids", "bad ids").renamed(chat.names).param == "messages"
    bad_schema = InvalidRequest.field("json_schema", "invalid JSON schema")
    schema = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object"}}}
    with_format = _chat(messages=USER, response_format=schema).req
    assert bad_schema.renamed(with_format.names).param == "response_format.json_schema.schema"
    assert InvalidRequest("no param").renamed(chat.names).param is None
    with pytest.raises(InvalidRequest) as info:  # the server's cap on top logprobs, as the client calls it
        _manager()._prepare(completion, _completion(prompt="x", logprobs=CAP + 1).req.prompts[0], [1])
    assert info.value.renamed(completion.names).param == "logprobs"


def test_grammar_extras_go_to_sampling_params() -> None:
    assert _completion(prompt="x", regex=r"\d{3}").req.prompts[0].sampling["regex"] == r"\d{3}"
    schema = {"type": "object"}
    chat = _chat(messages=USER, json_schema=schema, ebnf=None).req
    assert chat.prompts[0].sampling["json_schema"] == schema and "ebnf" not in chat.prompts[0].sampling
    assert chat.names["json_schema"] == "json_schema"
    fmt = _chat(messages=USER, response_format={"type": "json_object"}).req
    assert fmt.prompts[0].sampling["json_schema"] == "$$ANY$$"
    assert fmt.names["json_schema"] == "response_format" and fmt.read.tools is None


def test_usage_counts_prompts_once() -> None:
    assert usage([Usage(3, 2, 2), Usage(3, 3, 2)], n=2) == {
        "prompt_tokens": 3, "completion_tokens": 5, "total_tokens": 8, "prompt_tokens_details": {"cached_tokens": 2}}


def test_completion_response_with_echo_and_logprobs() -> None:
    parsed = _completion(prompt="Hi", echo=True, logprobs=1)
    parsed.echo_texts = ["Hi"]
    answer = CompletionAnswer(parsed)
    usage_ = Usage(1, 1, 0)
    answer.update(Update(0, [InputLogprobs(0, [[None, 5, "Hi"]], [None]), TextDelta(0, " there"),
                             Tokens(0, [6], [[-0.5, 6, " there"]], [[[-0.5, 6, " there"]]], usage_),
                             Finished(0, {"type": "stop"}, usage_, "r", 0.0)]))
    body = answer.final()
    choice = body["choices"][0]
    assert body["object"] == "text_completion" and choice["text"] == "Hi there"
    assert choice["finish_reason"] == "stop"
    assert choice["logprobs"] == {"tokens": ["Hi", " there"], "token_logprobs": [None, -0.5],
                                  "top_logprobs": [None, {" there": -0.5}], "text_offset": [0, 2]}


def test_chat_stream_sends_role_then_deltas_then_usage() -> None:
    answer = ChatAnswer(_chat(messages=USER, n=2, stream=True, stream_options={"include_usage": True}))
    start = answer.start()
    assert [c["choices"][0]["index"] for c in start] == [0, 1]
    assert start[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    deltas = []
    for update in (_choice(0, "He", 1, None), _choice(0, "llo", 2, None), _choice(1, "Yo", 1, "stop"),
                   _choice(0, "", 2, "length")):
        deltas += answer.update(update)
    texts = [(c["choices"][0]["index"], c["choices"][0]["delta"].get("content")) for c in deltas]
    assert texts == [(0, "He"), (0, "llo"), (1, "Yo"), (1, None), (0, None)]  # the reason in a last chunk
    assert [c["choices"][0]["finish_reason"] for c in deltas] == [None, None, None, "stop", "length"]
    tail = answer.end()
    assert tail[0]["choices"] == [] and tail[0]["usage"]["completion_tokens"] == 3


def test_models_list() -> None:
    async def run() -> dict[str, Any]:
        server = ServerState(ServerConfig(served_model_name="served", context_length=2048))
        server.attach(types.SimpleNamespace())  # type: ignore[arg-type]
        async with TestClient(TestServer(create_app(server))) as client:
            resp = await client.get("/v1/models")
            assert resp.status == 200
            return dict(await resp.json())

    listing = asyncio.run(run())
    assert listing["data"][0]["id"] == "served" and listing["data"][0]["max_model_len"] == 2048


ROUTER_DEFAULTS = {"continue_final_message": False, "return_hidden_states": False, "separate_reasoning": True,
                   "stream_reasoning": True}  # what sglang-router writes into every request it forwards


def test_sglang_extensions_the_router_forwards_are_accepted_when_neutral() -> None:
    chat = _chat(messages=USER, max_tokens=2, **ROUTER_DEFAULTS)
    assert chat.req.prompts[0].sampling["max_new_tokens"] == 2
    completion = _completion(prompt="x", max_tokens=2, return_hidden_states=False)
    assert completion.req.prompts[0].prompt == "x"


@pytest.mark.parametrize("field,value", [("return_hidden_states", True), ("continue_final_message", True),
                                         ("separate_reasoning", "yes")])
def test_sglang_extensions_that_ask_for_more_are_refused(field: str, value: Any) -> None:
    with pytest.raises(InvalidRequest) as info:
        _chat(messages=USER, **{field: value})
    assert info.value.param == field and info.value.message.startswith(field + ":")


def test_parallel_tool_calls_is_a_chat_field() -> None:
    tool = {"type": "function", "function": {"name": "f"}}
    plan = _chat(messages=USER, tools=[tool], parallel_tool_calls=False).req.read.tools
    assert plan is not None and not plan.parallel
    assert _chat(messages=USER, parallel_tool_calls=True).req.read.tools is None
    with pytest.raises(InvalidRequest) as info:
        _completion(prompt="x", parallel_tool_calls=True)
    assert info.value.param == "parallel_tool_calls"
