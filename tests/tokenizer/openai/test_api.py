"""Pure unit tests of the OpenAI mapping: requests -> manager bodies, outputs -> responses and
stream chunks (no server, no tokenizer)."""

from __future__ import annotations

from typing import Any

import pytest

from runtime.contracts.errors import InvalidRequest
from tokenizer.openai.api import ChatRenderer, CompletionRenderer, models_list, usage
from tokenizer.openai.protocol import plan_chat, plan_completion, translate

CAP = 5


def _completion(**req: Any):
    return plan_completion({"model": "m", **req}, "served", CAP, decode=lambda ids: f"<{len(ids)}>")


def _chat(**req: Any):
    return plan_chat({"model": "m", **req}, "served", CAP, context_length=100,
                     render=lambda messages, kwargs: [1, 2, 3])


def _out(text: str, tokens: int, reason: str | None = "length", index: int | None = None,
         **meta: Any) -> dict[str, Any]:
    out = {"text": text, "output_ids": list(range(tokens)), "meta_info": {
        "id": "r", "finish_reason": None if reason is None else {"type": reason},
        "prompt_tokens": 3, "completion_tokens": tokens, "cached_tokens": 2, **meta}}
    if index is not None:
        out["index"] = index
    return out


def test_completion_body_shapes() -> None:
    plan = _completion(prompt="hi", max_tokens=5, temperature=0, top_k=3, min_tokens=1, n=2)
    assert plan.body["text"] == "hi" and plan.n == 2 and plan.id.startswith("cmpl-")
    assert plan.body["sampling_params"] == {"max_new_tokens": 5, "temperature": 0, "top_k": 3,
                                            "min_new_tokens": 1, "n": 2}
    assert plan.body["rid"] == plan.id.removeprefix("cmpl-")
    assert _completion(prompt="hi").body["sampling_params"]["max_new_tokens"] == 16
    assert _completion(prompt=["a", "b"]).body["text"] == ["a", "b"]
    assert _completion(prompt=[1, 2]).body["input_ids"] == [1, 2]
    batch = _completion(prompt=[[1], [2, 3]], echo=True, logprobs=2)
    assert batch.body["input_ids"] == [[1], [2, 3]] and batch.num_prompts == 2
    assert batch.echo_texts == ["<1>", "<2>"]
    assert batch.body["logprob_start_len"] == 0 and batch.body["top_logprobs_num"] == 2


def test_chat_body_defaults_to_the_rest_of_the_context() -> None:
    plan = _chat(messages=[{"role": "developer", "content": [{"type": "text", "text": "x"}]}])
    assert plan.body["input_ids"] == [1, 2, 3]
    assert plan.body["sampling_params"]["max_new_tokens"] == 97
    plan = _chat(messages=[{"role": "user", "content": "x"}], max_tokens=9,
                 max_completion_tokens=4, logprobs=True, top_logprobs=2, stream=True,
                 stream_options={"include_usage": True})
    assert plan.body["sampling_params"]["max_new_tokens"] == 4
    assert plan.body["top_logprobs_num"] == 2 and plan.include_usage and plan.stream


@pytest.mark.parametrize(("req", "param"), [
    ({"prompt": ""}, "prompt"), ({"prompt": [1, "a"]}, "prompt"),
    ({"prompt": "x", "echo": 1}, "echo"),
    ({"prompt": "x", "logprobs": 6}, "logprobs"),
    ({"prompt": "x", "bogus": 1}, "bogus"), ({"prompt": "x", "model": 3}, "model"),
    ({"prompt": "x", "stream": True, "stream_options": {"x": 1}}, "stream_options"),
])
def test_completion_rejections_name_the_field(req: dict[str, Any], param: str) -> None:
    with pytest.raises(InvalidRequest) as info:
        _completion(**req)
    assert info.value.param == param


@pytest.mark.parametrize(("req", "param"), [
    ({"messages": "hi"}, "messages"), ({"messages": [{"role": "user"}]}, "messages[0].content"),
    ({"messages": [{"role": "user", "content": "x"}], "response_format": {"type": "json_schema"}},
     "response_format.json_schema"),
    ({"messages": [{"role": "user", "content": "x"}], "tool_choice": "required"}, "tool_choice"),
    ({"messages": [{"role": "user", "content": "x"}], "logprobs": "yes"}, "logprobs"),
])
def test_chat_rejections_name_the_field(req: dict[str, Any], param: str) -> None:
    with pytest.raises(InvalidRequest) as info:
        _chat(**req)
    assert info.value.param == param


def test_manager_errors_are_renamed() -> None:
    exc = translate(InvalidRequest("max_new_tokens must be >= 0", "max_new_tokens"), "chat")
    assert exc.param == "max_tokens" and exc.message == "max_tokens must be >= 0"
    assert translate(InvalidRequest("bad text", "text"), "completion").param == "prompt"
    bad_schema = InvalidRequest("invalid JSON schema", "json_schema")
    renames = {"json_schema": "response_format.json_schema.schema"}
    assert translate(bad_schema, "chat", renames).param == renames["json_schema"]
    assert translate(InvalidRequest("bad", "sampling_params.regex"), "chat").param == "regex"
    assert translate(InvalidRequest("no param"), "chat").param is None


def test_grammar_extras_go_to_sampling_params() -> None:
    params = _completion(prompt="x", regex=r"\d{3}").body["sampling_params"]
    assert params["regex"] == r"\d{3}"
    schema = {"type": "object"}
    chat = _chat(messages=[{"role": "user", "content": "x"}], json_schema=schema, ebnf=None)
    assert chat.body["sampling_params"]["json_schema"] == schema and chat.renames == {}
    fmt = _chat(messages=[{"role": "user", "content": "x"}],
                response_format={"type": "json_object"})
    assert fmt.body["sampling_params"]["json_schema"] == "$$ANY$$"
    assert fmt.renames == {"json_schema": "response_format"} and fmt.tools is None


def test_usage_counts_prompts_once() -> None:
    metas = [_out("a", 2)["meta_info"], _out("b", 3)["meta_info"]]
    assert usage(metas, n=2) == {"prompt_tokens": 3, "completion_tokens": 5, "total_tokens": 8,
                                 "prompt_tokens_details": {"cached_tokens": 2}}


def test_completion_response_with_echo_and_logprobs() -> None:
    plan = _completion(prompt="Hi", echo=True, logprobs=1)
    meta = {"input_token_logprobs": [[None, 5, "Hi"]], "input_top_logprobs": [None],
            "output_token_logprobs": [[-0.5, 6, " there"]],
            "output_top_logprobs": [[[-0.5, 6, " there"]]]}
    body = CompletionRenderer(plan).final(_out(" there", 1, "stop", **meta))
    choice = body["choices"][0]
    assert body["object"] == "text_completion" and choice["text"] == "Hi there"
    assert choice["finish_reason"] == "stop"
    assert choice["logprobs"] == {"tokens": ["Hi", " there"], "token_logprobs": [None, -0.5],
                                  "top_logprobs": [None, {" there": -0.5}], "text_offset": [0, 2]}


def test_chat_stream_sends_role_then_deltas_then_usage() -> None:
    plan = _chat(messages=[{"role": "user", "content": "x"}], n=2, stream=True,
                 stream_options={"include_usage": True})
    r = ChatRenderer(plan)
    start = r.start()
    assert [c["choices"][0]["index"] for c in start] == [0, 1]
    assert start[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    deltas = []
    for out in (_out("He", 1, None, 0), _out("Hello", 2, None, 0), _out("Yo", 1, "stop", 1),
                _out("Hello", 2, "length", 0)):
        deltas += r.chunks(out)
    texts = [(c["choices"][0]["index"], c["choices"][0]["delta"].get("content")) for c in deltas]
    assert texts == [(0, "He"), (0, "llo"), (1, "Yo"), (0, None)]
    assert deltas[-1]["choices"][0]["finish_reason"] == "length"
    tail = r.end()
    assert tail[0]["choices"] == [] and tail[0]["usage"]["completion_tokens"] == 3


def test_models_list() -> None:
    listing = models_list("served", 123, 2048)
    assert listing["data"][0]["id"] == "served" and listing["data"][0]["max_model_len"] == 2048


ROUTER_DEFAULTS = {"continue_final_message": False, "return_hidden_states": False, "separate_reasoning": True,
                   "stream_reasoning": True}  # what sglang-router writes into every request it forwards


def test_sglang_extensions_the_router_forwards_are_accepted_when_neutral() -> None:
    chat = _chat(messages=[{"role": "user", "content": "x"}], max_tokens=2, **ROUTER_DEFAULTS)
    assert chat.body["sampling_params"]["max_new_tokens"] == 2
    assert "return_hidden_states" not in chat.body
    completion = _completion(prompt="x", max_tokens=2, return_hidden_states=False)
    assert completion.body["text"] == "x"


@pytest.mark.parametrize("field,value", [("return_hidden_states", True), ("continue_final_message", True),
                                         ("separate_reasoning", "yes")])
def test_sglang_extensions_that_ask_for_more_are_refused(field: str, value: Any) -> None:
    with pytest.raises(InvalidRequest, match="not supported") as info:
        _chat(messages=[{"role": "user", "content": "x"}], **{field: value})
    assert info.value.param == field


def test_parallel_tool_calls_is_a_chat_field() -> None:
    tool = {"type": "function", "function": {"name": "f"}}
    chat = _chat(messages=[{"role": "user", "content": "x"}], tools=[tool], parallel_tool_calls=False)
    assert chat.tools is not None and not chat.tools.parallel
    assert _chat(messages=[{"role": "user", "content": "x"}], parallel_tool_calls=True).tools is None
    with pytest.raises(InvalidRequest) as info:
        _completion(prompt="x", parallel_tool_calls=True)
    assert info.value.param == "parallel_tool_calls"
