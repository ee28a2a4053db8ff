"""Hostile input by class, generated from the server's own field specs (its /openapi.json).

For every route with a body and every field the spec declares (top-level, and inside the
objects and first list elements of a valid base body), it sends: a value of each JSON type the
field does not take, a string or list one past its bound, and a value nested 200 levels deep.
Each must be a 4xx naming that field (the error's `param`, or the head of Anthropic's message),
and the server must be healthy and idle afterwards, and still answer a short chat.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import requests

from tests.tokenizer.http_helpers import RunningServer, post, wait_idle

BASES: dict[str, tuple[str, dict[str, Any]]] = {  # path -> (body schema, a valid body)
    "/generate": ("GenerateRequest", {"text": "hi", "sampling_params": {"max_new_tokens": 1}}),
    "/v1/completions": ("CompletionRequest", {"model": "m", "prompt": "hi", "max_tokens": 1}),
    "/v1/chat/completions": ("ChatCompletionRequest", {
        "model": "m", "max_tokens": 1, "messages": [{"role": "user", "content": "hi"}],
        "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}],
        "response_format": {"type": "text"}}),
    "/v1/responses": ("ResponseRequest", {"model": "m", "input": [{"role": "user", "content": "hi"}],
                                          "max_output_tokens": 1, "store": False,
                                          "tools": [{"type": "function", "name": "f"}]}),
    "/v1/messages": ("MessagesRequest", {
        "model": "m", "max_tokens": 1,
        "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}],
        "tools": [{"name": "f", "input_schema": {"type": "object"}}]}),
    "/v1/messages/count_tokens": ("CountTokensRequest",
                                  {"model": "m", "messages": [{"role": "user", "content": "hi"}]}),
    "/tokenize": ("TokenizeRequest", {"prompt": "hi"}),
    "/detokenize": ("DetokenizeRequest", {"tokens": [1]}),
    "/abort_request": ("AbortRequest", {"rid": "nobody-has-this-rid"}),
    "/v1/embeddings": ("EmbeddingRequest", {"model": "m", "input": ["hi"], "encoding_format": "float",
                                            "dimensions": 8}),
    "/v1/rerank": ("RerankRequest", {"model": "m", "query": "hi", "documents": [{"text": "a"}], "top_n": 1,
                                     "return_documents": True}),
    "/v1/score": ("ScoreRequest", {"model": "m", "text_1": "hi", "text_2": ["a"]}),
}
SAMPLES = {"string": "x", "integer": 7, "number": 1.5, "boolean": True, "array": [1], "object": {"a": 1},
           "null": None}
LONGEST = 200_000  # bounds above this fall to the body limit (413) before the field's own check
DEPTH = 200


def _resolve(schema: dict[str, Any], doc: dict[str, Any]) -> dict[str, Any]:
    while "$ref" in schema:
        schema = doc["components"]["schemas"][schema["$ref"].rsplit("/", 1)[1]]
    return schema


def _members(schema: dict[str, Any], doc: dict[str, Any]) -> list[dict[str, Any]]:
    """The alternatives a value may take (a union's members, flattened)."""
    schema = _resolve(schema, doc)
    alternatives = schema.get("anyOf") or schema.get("oneOf")
    if alternatives:
        return [m for a in alternatives for m in _members(a, doc)]
    return [schema]


def _types(schema: dict[str, Any], doc: dict[str, Any]) -> set[str]:
    """The JSON types a field takes ("all" for free JSON)."""
    out: set[str] = set()
    for member in _members(schema, doc):
        if "const" in member or "enum" in member:
            values = [member["const"]] if "const" in member else member["enum"]
            out |= {_kind(v) for v in values}
        elif "type" in member:
            kinds = member["type"] if isinstance(member["type"], list) else [member["type"]]
            out |= set(kinds) | ({"integer"} if "number" in kinds else set())
        else:
            return {"all"}
    return out


def _kind(value: Any) -> str:
    return {bool: "boolean", int: "integer", float: "number", str: "string", list: "array", dict: "object",
            type(None): "null"}[type(value)]


def _fields(schema: dict[str, Any], base: Any, path: list[Any], doc: dict[str, Any]) -> Iterator[tuple]:
    """(path, field schema) of every declared field, recursing where the base holds a value."""
    for member in _members(schema, doc):
        props = member.get("properties")
        if not props or not isinstance(base, dict) or not _matches(member, base):
            continue
        for name, prop in props.items():
            yield path + [name], prop
            value = base.get(name)
            if isinstance(value, dict):
                yield from _fields(prop, value, path + [name], doc)
            elif isinstance(value, list) and value and isinstance(value[0], dict):
                for item in _members(prop, doc):
                    if item.get("type") == "array" and "items" in item:
                        yield from _fields(item["items"], value[0], path + [name, 0], doc)
        return


def _matches(member: dict[str, Any], value: dict[str, Any]) -> bool:
    """Does `value` fit this union member's tags (its const `type` / `role`)?"""
    for key, prop in member.get("properties", {}).items():
        allowed = [prop["const"]] if "const" in prop else prop.get("enum")
        if allowed is not None and key in value and value[key] not in allowed:
            return False
    return not (set(value) - set(member.get("properties", {}))) or member.get("additionalProperties") is not False


def _with(base: dict[str, Any], path: list[Any], value: Any) -> dict[str, Any]:
    import copy

    body = copy.deepcopy(base)
    node: Any = body
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return body


def _deep() -> Any:
    value: Any = 1
    for _ in range(DEPTH):
        value = [value]
    return value


def _cases(doc: dict[str, Any]) -> Iterator[tuple[str, list[Any], str, Any]]:
    """(route, field path, what, value) for every field of every body."""
    for route, (name, base) in BASES.items():
        for path, prop in _fields(doc["components"]["schemas"][name], base, [], doc):
            kinds = _types(prop, doc)
            if "all" not in kinds:
                for kind, sample in SAMPLES.items():
                    if kind not in kinds:
                        yield route, path, f"a {kind}", sample
            for member in _members(prop, doc):
                if member.get("type") == "string" and member.get("maxLength", LONGEST + 1) <= LONGEST:
                    yield route, path, "an over-long string", "x" * (member["maxLength"] + 1)
                if member.get("type") == "array" and member.get("maxItems", LONGEST + 1) <= LONGEST:
                    yield route, path, "an over-long list", ["x"] * (member["maxItems"] + 1)
            yield route, path, "a value nested too deep", _deep()


def _named(route: str, path: list[Any], body: dict[str, Any]) -> str:
    dots = route.startswith("/v1/messages")
    out = ""
    for key in path:
        if isinstance(key, int):
            out += f".{key}" if dots else f"[{key}]"
        else:
            out += f".{key}" if out else key
    return out


def test_every_field_refuses_every_wrong_class_with_a_4xx_naming_it(shared_server: RunningServer) -> None:
    doc = requests.get(shared_server.url + "/openapi.json", timeout=30).json()
    cases = list(_cases(doc))
    assert len(cases) > 500, f"only {len(cases)} cases: the walk lost the specs"
    failures = []
    for route, path, what, value in cases:
        body = _with(BASES[route][1], path, value)
        resp = post(shared_server, route, body)
        field = _named(route, path, body)
        error = resp.json().get("error", {}) if resp.headers.get("content-type", "").startswith("application/json") \
            else {}
        named = error.get("param") or error.get("message", "")
        if not (400 <= resp.status_code < 500 and str(named).startswith(field)):
            failures.append(f"{route} {field} <- {what}: {resp.status_code} {resp.text[:160]}")
    assert not failures, f"{len(failures)} of {len(cases)} cases:\n" + "\n".join(failures[:40])
    _assert_sound(shared_server)


def _assert_sound(server: RunningServer) -> None:
    assert requests.get(server.url + "/health", timeout=10).status_code == 200
    wait_idle(server)
    resp = post(server, "/v1/chat/completions", {"model": "m", "max_tokens": 2, "temperature": 0,
                                                  "messages": [{"role": "user", "content": "hi"}]})
    assert resp.status_code == 200, resp.text


@pytest.mark.parametrize("route", sorted(BASES))
def test_every_base_body_is_accepted(shared_server: RunningServer, route: str) -> None:
    """The bases the cases mutate are valid, so each case's 4xx is its own field's."""
    resp = post(shared_server, route, BASES[route][1])
    assert resp.status_code == 200, resp.text
