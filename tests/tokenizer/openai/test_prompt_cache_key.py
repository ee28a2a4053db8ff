"""OpenAI's `prompt_cache_key` on chat completions, completions and responses: a bounded string,
taken as a label only (never the cache's namespace, which `cache_salt` / `extra_key` set), its
wrong types 400s naming it; and the cached-token counts OpenAI's usage reports. No model."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from runtime.contracts.config import ServerConfig
from runtime.contracts.errors import InvalidRequest
from tokenizer.core.events import Usage
from tokenizer.core.request import GenRequest
from tokenizer.openai.chat import parse_chat
from tokenizer.openai.common import usage
from tokenizer.openai.completions import parse_completion
from tokenizer.openai.responses.request import parse_response

ROUTES: dict[str, tuple[dict[str, Any], Callable[[dict[str, Any]], GenRequest]]] = {
    "chat": ({"model": "m", "messages": [{"role": "user", "content": "hi"}]},
             lambda b: parse_chat(b, ServerConfig(), "m").req),
    "completions": ({"model": "m", "prompt": "hi"}, lambda b: parse_completion(b, "m").req),
    "responses": ({"model": "m", "input": "hi"}, lambda b: parse_response(b, ServerConfig()).template),
}


@pytest.mark.parametrize("route", ROUTES)
def test_a_prompt_cache_key_is_a_label_not_the_cache_namespace(route: str) -> None:
    body, parse = ROUTES[route]
    assert parse({**body, "prompt_cache_key": "session-42"}).cache_namespace is None
    salted = parse({**body, "prompt_cache_key": "session-42", "cache_salt": "tenant-a"})
    assert salted.cache_namespace == "tenant-a"  # the salt alone, whatever the key
    assert parse({**body, "prompt_cache_key": "x" * 256}).cache_namespace is None


@pytest.mark.parametrize("route", ROUTES)
@pytest.mark.parametrize("value", [42, True, ["session"], {"key": "session"}, "", "x" * 257])
def test_a_bad_prompt_cache_key_is_a_400_naming_it(route: str, value: Any) -> None:
    body, parse = ROUTES[route]
    with pytest.raises(InvalidRequest) as info:
        parse({**body, "prompt_cache_key": value})
    assert info.value.param == "prompt_cache_key" and info.value.message.startswith("prompt_cache_key: ")


def test_the_responses_object_echoes_the_key() -> None:
    parsed = parse_response({"model": "m", "input": "hi", "prompt_cache_key": "session-42"}, ServerConfig())
    assert parsed.echo["prompt_cache_key"] == "session-42"


def test_usage_reports_the_cached_prompt_tokens_once_per_prompt() -> None:
    out = usage([Usage(10, 2, 4), Usage(10, 3, 4)], n=2)  # one prompt, two samples
    assert out == {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15,
                   "prompt_tokens_details": {"cached_tokens": 4}}
