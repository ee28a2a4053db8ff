"""Chat template rendering (tokenizer/core/chat_template.py): off the event loop and under a time bound.
The tokenizer's own template renders on a thread; a request's template (--trust-request-chat-
template) in a killable helper process, which a template looping for ever or allocating without
end cannot hold. The default model's tokenizer; no server."""

from __future__ import annotations

import asyncio
import time
import types
from collections.abc import Awaitable, Iterator
from typing import Any, TypeVar

import pytest

from runtime.contracts.config import ServerConfig
from runtime.contracts.errors import InvalidRequest
from tokenizer.admission import PromptEncoder
from tokenizer.core.chat_template import RequestTemplate, default_sandbox, render_chat
from tokenizer.core.pipeline import render_chats
from tokenizer.core.request import ChatInput
from tokenizer.limits import RequestLimits
from tokenizer.manager import TokenizerManager
from tokenizer.openai.chat import parse_chat

T = TypeVar("T")
MSG = [{"role": "user", "content": "hi"}]
# Nested range() loops: 10^10 iterations, hours of Jinja.
ENDLESS = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"
SIMPLE = ("{{ bos_token }}{% for m in messages %}{{ m.role }}:{{ m.content }}{% endfor %}"
          "{% if flag %}!{% endif %}{% if add_generation_prompt %}>{% endif %}")


@pytest.fixture(scope="module")
def tokenizer(default_model_path: str) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(default_model_path)


@pytest.fixture(scope="module", autouse=True)
def stop_the_helper() -> Iterator[None]:
    yield
    default_sandbox().close()


def _manager(tokenizer: Any, **config: Any) -> Any:
    """What the chat path reads of a TokenizerManager, with its real apply_chat_template."""
    limits = RequestLimits(vocab_size=len(tokenizer), context_length=2048, kv_total=None, max_n=4,
                           max_top_logprobs=5)
    tm = types.SimpleNamespace(tokenizer=tokenizer, encoder=PromptEncoder(tokenizer),
                               context_length=2048, scheduler_info={}, limits=limits,
                               config=ServerConfig(**config))
    tm.apply_chat_template = types.MethodType(TokenizerManager.apply_chat_template, tm)
    return tm


async def _ticking(work: Awaitable[T]) -> tuple[T | BaseException, int, float]:
    """(work's result or exception, event-loop ticks of 10 ms meanwhile, seconds taken)."""
    ticks = 0

    async def tick() -> None:
        nonlocal ticks
        while True:
            await asyncio.sleep(0.01)
            ticks += 1

    ticker = asyncio.create_task(tick())
    start = time.monotonic()
    try:
        result: T | BaseException = await work
    except Exception as exc:  # noqa: BLE001  (returned for the test to inspect)
        result = exc
    ticker.cancel()
    return result, ticks, time.monotonic() - start


def test_the_tokenizers_template_renders_as_transformers_does(tokenizer: Any) -> None:
    tm = _manager(tokenizer)
    text = asyncio.run(render_chat(tm, MSG, None, {"enable_thinking": False}))
    assert text == tokenizer.apply_chat_template(MSG, tokenize=False, add_generation_prompt=True)
    with pytest.raises(InvalidRequest) as info:
        tm.apply_chat_template(MSG, chat_template="Z{{ messages }}")
    assert info.value.param == "chat_template"
    with pytest.raises(InvalidRequest) as info:  # what only a Python caller can pass
        asyncio.run(render_chat(tm, [{"role": "user", "content": "\ud800"}], None, {}))
    assert info.value.param == "messages" and "surrogate" in info.value.message


def test_a_slow_render_of_the_tokenizers_template_is_a_400_and_the_loop_runs_on() -> None:
    def slow(messages: list[dict[str, Any]], tools: Any = None, **variables: Any) -> str:
        time.sleep(1.0)
        return "late"

    tm = types.SimpleNamespace(apply_chat_template=slow)
    result, ticks, took = asyncio.run(_ticking(render_chat(tm, MSG, None, {}, timeout_s=0.3)))
    assert isinstance(result, InvalidRequest) and result.param == "messages", result
    assert "longer than 0.3 s" in result.message and took < 0.9 and ticks >= 10


def test_a_request_template_renders_in_the_helper_and_an_endless_one_is_stopped(
        tokenizer: Any) -> None:
    tm = _manager(tokenizer)
    own = RequestTemplate(SIMPLE, "chat_template")
    text = asyncio.run(render_chat(tm, MSG, None, {"flag": True}, own, timeout_s=60))
    assert text == "<|im_start|>user:hi!>"  # the tokenizer's special tokens are variables too
    endless = RequestTemplate(ENDLESS, "chat_template_kwargs.chat_template")
    result, ticks, took = asyncio.run(_ticking(render_chat(tm, MSG, None, {}, endless,
                                                           timeout_s=1.0)))
    assert isinstance(result, InvalidRequest), result
    assert result.param == "chat_template_kwargs.chat_template" and "longer than 1 s" in result.message
    assert took < 10 and ticks >= 50  # the loop kept serving while the helper spun
    again = asyncio.run(render_chat(tm, MSG, None, {}, own, timeout_s=60))  # a fresh helper
    assert again == "<|im_start|>user:hi>"


def test_a_request_template_that_fails_or_allocates_without_end_is_a_400(tokenizer: Any) -> None:
    tm = _manager(tokenizer)
    cases = {"{{ raise_exception('no \\ud800 here') }}": "no", "{{ 'x' * 4000000000 }}": "memory",
             "{% for": "end of template", "{{ messages[0].content[:1] + '\\udc00' }}": "surrogate"}
    for source, words in cases.items():
        with pytest.raises(InvalidRequest) as info:
            asyncio.run(render_chat(tm, MSG, None, {}, RequestTemplate(source, "chat_template"),
                                    timeout_s=60))
        assert info.value.param == "chat_template" and words in info.value.message, info.value
        info.value.message.encode("utf-8")  # valid Unicode: it goes into a JSON response


def _rendered_ids(tokenizer: Any, config: ServerConfig, body: dict[str, Any]) -> list[int]:
    """The chat path: the body parsed, its chat rendered and tokenized as the pipeline does."""
    req = parse_chat(body, config, "m").req
    assert isinstance(req.prompts[0].prompt, ChatInput)
    prompt = asyncio.run(render_chats(_manager(tokenizer), req)).prompts[0].prompt
    assert isinstance(prompt, list)
    return prompt


def test_the_trust_flag_lets_a_request_template_through_the_chat_path(tokenizer: Any) -> None:
    body = {"model": "m", "messages": MSG, "chat_template_kwargs": {"chat_template": "Z{{ messages[0].content }}"}}
    with pytest.raises(InvalidRequest) as info:
        parse_chat(body, ServerConfig(), "m")
    assert info.value.param == "chat_template_kwargs.chat_template"
    assert "--trust-request-chat-template" in info.value.message
    trusted = ServerConfig(trust_request_chat_template=True)
    assert _rendered_ids(tokenizer, trusted, body) == tokenizer.encode("Zhi", add_special_tokens=False)
    expected = tokenizer.apply_chat_template(MSG, tokenize=False, add_generation_prompt=True)
    plain = _rendered_ids(tokenizer, trusted, {"model": "m", "messages": MSG})
    assert plain == tokenizer.encode(expected, add_special_tokens=False)
