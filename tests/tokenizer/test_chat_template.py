"""Chat template rendering (tokenizer/chat_template.py): off the event loop and under a time bound.
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
from tokenizer.chat_template import RequestTemplate, default_sandbox, render_chat
from tokenizer.manager import TokenizerManager
from tokenizer.openai.api import plan_chat_request

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
    tm = types.SimpleNamespace(tokenizer=tokenizer, encoder=PromptEncoder(tokenizer),
                               context_length=2048, scheduler_info={},
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


def test_the_trust_flag_lets_a_request_template_through_the_chat_path(tokenizer: Any) -> None:
    body = {"model": "m", "messages": MSG, "chat_template_kwargs": {"chat_template": "Z{{ messages[0].content }}"}}
    with pytest.raises(InvalidRequest) as info:
        asyncio.run(plan_chat_request(_manager(tokenizer), ServerConfig(), body, "m"))
    assert info.value.param == "chat_template_kwargs.chat_template"
    trusted = ServerConfig(trust_request_chat_template=True)
    plan = asyncio.run(plan_chat_request(_manager(tokenizer), trusted, body, "m"))
    assert plan.body["input_ids"] == tokenizer.encode("Zhi", add_special_tokens=False)
    plain = asyncio.run(plan_chat_request(_manager(tokenizer), trusted, {"model": "m", "messages": MSG}, "m"))
    expected = tokenizer.apply_chat_template(MSG, tokenize=False, add_generation_prompt=True)
    assert plain.body["input_ids"] == tokenizer.encode(expected, add_special_tokens=False)
