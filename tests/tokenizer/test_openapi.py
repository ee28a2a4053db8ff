"""The OpenAPI document (tokenizer/openapi.py, built from the field specs) against the code it
describes: the routes `create_app` serves, the fields and ranges the validators accept, the
error shape, and the route itself (in-process app, fake manager). The live server meets schemathesis in
test_fuzz_schemathesis.py."""

from __future__ import annotations

import asyncio
import json
import re
from dataclasses import fields
from typing import Any, ClassVar

import jsonschema_rs
import pytest
import schemathesis
from aiohttp.test_utils import TestClient, TestServer

from runtime.contracts.config import ServerConfig
from runtime.contracts.errors import InvalidRequest
from runtime.contracts.sampling import SamplingParams
from tokenizer import native_api, token_routes
from tokenizer.core.fields import MAX_PROMPTS, MAX_TOKENS, SamplingSpec
from tokenizer.core.spec import parse
from tokenizer.core.tools import TOOL_NAME
from tokenizer.errors import error_body
from tokenizer.http_server import create_app
from tokenizer.limits import RequestLimits
from tokenizer.native.generate import parse_generate
from tokenizer.openai.chat import parse_chat
from tokenizer.openai.common import SAMPLING_FIELDS, SAMPLING_NAMES
from tokenizer.openai.completions import parse_completion
from tokenizer.openapi import BODIES, document
from tokenizer.server_state import ServerState

DOC = document()
SCHEMAS = DOC["components"]["schemas"]
CHAT = [{"role": "user", "content": "hi"}]


def _props(name: str) -> dict[str, Any]:
    return dict(SCHEMAS[name]["properties"])


def _accepts_null(schema: dict[str, Any]) -> bool:
    kinds = schema.get("type")
    return (isinstance(kinds, list) and "null" in kinds) or schema.get("type") == "null" or any(
        alt.get("type") == "null" for alt in schema.get("anyOf", []))


def _optional(name: str) -> dict[str, dict[str, Any]]:
    required = set(SCHEMAS[name].get("required", []))
    return {k: v for k, v in _props(name).items() if k not in required}


def _alternative(prop: dict[str, Any], kind: str) -> dict[str, Any]:
    """The member of `prop`'s anyOf of JSON type `kind`."""
    return next(alt for alt in prop["anyOf"] if alt.get("type") == kind)


# ---------------------------------------------------------------- the document


@pytest.mark.parametrize("api_key", [False, True])
def test_the_document_is_valid_openapi_3_1(api_key: bool) -> None:
    doc = document(api_key)
    schemathesis.openapi.from_dict(doc).validate()  # against the 3.1 meta-schema
    assert doc["openapi"] == "3.1.0" and json.loads(json.dumps(doc)) == doc


def test_every_route_the_app_serves_is_documented_and_nothing_else() -> None:
    app = create_app(ServerState(ServerConfig()))
    served = {(r.method, r.resource.canonical) for r in app.router.routes()
              if r.method != "HEAD" and r.resource is not None}
    documented = {(method.upper(), path) for path, ops in DOC["paths"].items() for method in ops}
    assert served == documented


def test_every_answer_names_its_statuses_and_errors_are_the_error_object() -> None:
    for path, ops in DOC["paths"].items():
        for method, op in ops.items():
            statuses = set(op["responses"])
            assert {"200", "403", "503"} <= statuses, (method, path)
            if "requestBody" in op:
                assert {"400", "413", "415"} <= statuses, (method, path)
            for status in statuses - {"200"}:
                content = op["responses"][status]["content"]["application/json"]
                shape = "AnthropicError" if path.startswith("/v1/messages") else "Error"
                assert content["schema"] == {"$ref": f"#/components/schemas/{shape}"}
    validator = jsonschema_rs.validator_for(SCHEMAS["Error"])
    for status, param in ((400, "temperature"), (503, None)):
        assert validator.is_valid(error_body(status, "message", param))


def test_an_api_key_is_documented_and_health_stays_open() -> None:
    doc = document(api_key=True)
    assert doc["security"] == [{"bearer": []}]
    assert doc["components"]["securitySchemes"]["bearer"]["scheme"] == "bearer"
    assert doc["paths"]["/health"]["get"]["security"] == []
    assert "401" not in doc["paths"]["/health"]["get"]["responses"]
    assert "401" in doc["paths"]["/openapi.json"]["get"]["responses"]
    assert "security" not in DOC and "401" not in DOC["paths"]["/generate"]["post"]["responses"]


def test_the_specs_bounds_are_the_documents() -> None:
    """The document is the specs' (the server's own caps, --max-n and the context, are checked
    after parsing and named in their 400s)."""
    sampling = _props("SamplingSpec")
    assert _alternative(sampling["n"], "integer")["maximum"] == 1024
    assert _alternative(sampling["stop_token_ids"], "array")["items"]["exclusiveMaximum"] == 1 << 31
    assert _alternative(_props("CompletionRequest")["logprobs"], "integer")["maximum"] == 1024
    text = _alternative(_props("GenerateRequest")["text"], "array")
    assert text["maxItems"] == MAX_PROMPTS and text["items"]["minLength"] == 1


def _chat_accepted(extra: dict[str, Any]) -> bool:
    try:
        parse_chat({"messages": CHAT, **extra}, ServerConfig(), "m")
    except InvalidRequest:
        return False
    return True


def _documented(schema: str, field: str, value: Any) -> bool:
    return jsonschema_rs.validator_for(_props(schema)[field]).is_valid(value)


@pytest.mark.parametrize("key", ["ok_1", "_x", "1x", "a-b", "a" * 64, "a" * 65, ""])
def test_a_template_variables_name_is_documented_as_validated(key: str) -> None:
    documented = _documented("ChatCompletionRequest", "chat_template_kwargs", {key: 1})
    assert _chat_accepted({"chat_template_kwargs": {key: 1}}) == documented, key


@pytest.mark.parametrize("key", ["5", "-3", "x", "1.5", "1" * 11, ""])
def test_a_logit_bias_key_is_documented_as_validated(key: str) -> None:
    assert _documented("SamplingSpec", "logit_bias", {key: 1.0}) == _spec_accepts({"logit_bias": {key: 1.0}}), key
    assert not _documented("SamplingSpec", "logit_bias", {key: 101.0})


@pytest.mark.parametrize("name", ["get_weather", "a-b_9", "bad name", "x" * 64, "x" * 65, "", "é"])
def test_a_tool_names_pattern_is_the_validators(name: str) -> None:
    pattern = SCHEMAS["FunctionSpec"]["properties"]["name"]["pattern"]
    assert pattern == TOOL_NAME
    tool = {"type": "function", "function": {"name": name, "parameters": {"type": "object"}}}
    assert _chat_accepted({"tools": [tool]}) == (re.search(pattern, name) is not None), name


# ---------------------------------------------------------------- sampling parameters


def test_sampling_params_are_the_fields_from_dict_accepts() -> None:
    props = _props("SamplingSpec")
    assert set(props) == {f.name for f in fields(SamplingParams)} | {"sampling_seed"}
    assert SCHEMAS["SamplingSpec"]["additionalProperties"] is False
    assert all(_accepts_null(p) for p in props.values())
    nulls = {name: None for name in props}
    assert SamplingParams.from_dict(parse(SamplingSpec, nulls).as_params()) == SamplingParams()


SAMPLES = {"integer": 1, "number": 0.5, "boolean": True, "string": "x", "array": [], "object": {}}


def _spec_accepts(body: dict[str, Any]) -> bool:
    """The spec parses `body` and SamplingParams takes what it gives (its ranges aside)."""
    try:
        params = parse(SamplingSpec, body).as_params()
    except InvalidRequest:
        return False
    SamplingParams.from_dict(params)  # NOTE: never refuses what the spec let through
    return True


@pytest.mark.parametrize("name", sorted(_props("SamplingSpec")))
def test_documented_types_are_the_types_the_spec_accepts(name: str) -> None:
    validator = jsonschema_rs.validator_for(_props("SamplingSpec")[name])
    for kind, value in SAMPLES.items():
        assert validator.is_valid(value) == _spec_accepts({name: value}), (name, kind)


def _bound_cases(prop: dict[str, Any], integer: bool = False) -> list[tuple[Any, bool]]:
    """(value, documented as accepted) at and past each numeric bound of `prop` and its anyOf."""
    integer = integer or "integer" in str(prop.get("type"))
    step = 1 if integer else 1e-6
    cases: list[tuple[Any, bool]] = []
    for key, inside, outside in (("minimum", 0, -step), ("maximum", 0, step),
                                 ("exclusiveMinimum", step, 0), ("exclusiveMaximum", -step, 0)):
        if key in prop:
            cases += [(prop[key] + inside, True), (prop[key] + outside, False)]
    if "const" in prop:
        cases.append((prop["const"], True))
    for alt in prop.get("anyOf", []):
        cases += _bound_cases(alt, integer)
    return cases


def _request_accepted(name: str, value: Any) -> bool:
    """Through the spec, `SamplingParams` and its `validate` (no vocabulary: the model's limits
    are the manager's, after parsing)."""
    body = {name: value, **({"max_new_tokens": MAX_TOKENS} if name == "min_new_tokens" else {})}
    try:
        SamplingParams.from_dict(parse(SamplingSpec, body).as_params()).validate()
    except InvalidRequest as exc:
        assert exc.param in (name, "seed" if name == "sampling_seed" else name), exc
        return False
    return True


@pytest.mark.parametrize("name", sorted(_props("SamplingSpec")))
def test_documented_ranges_are_the_validators(name: str) -> None:
    for value, documented in _bound_cases(_props("SamplingSpec")[name]):
        assert _request_accepted(name, value) == documented, (name, value)
    if name == "seed":
        assert _request_accepted("seed", (1 << 63) - 1) and not _request_accepted("seed", 1 << 63)


# ---------------------------------------------------------------- request bodies


class FakeManager:
    scheduler_info: ClassVar[dict[str, int]] = {"vocab_size": 10}
    limits = RequestLimits(vocab_size=10, context_length=64, kv_total=None, max_n=4, max_top_logprobs=5)

    class encoder:  # the manager's attribute
        @staticmethod
        async def encode_texts(prompts: list[str], add_special: bool) -> list[list[int]]:
            return [[1] for _ in prompts]

        @staticmethod
        async def decode(seqs: list[list[int]], skip_special_tokens: bool = False) -> list[str]:
            return ["x" for _ in seqs]

    async def abort(self, rid: str, owner: str | None = None) -> None: ...

    async def abort_all(self, owner: str | None = None) -> None: ...


class FakeServer:
    config = ServerConfig()

    def manager(self) -> FakeManager:
        return FakeManager()


@pytest.mark.parametrize("schema", sorted(BODIES))
def test_each_body_is_its_spec(schema: str) -> None:
    model = BODIES[schema]
    assert set(_props(schema)) == {f.alias or name for name, f in model.model_fields.items()}
    required = {f.alias or name for name, f in model.model_fields.items() if f.is_required()}
    assert set(SCHEMAS[schema].get("required", [])) == required


def test_generate_fields_are_the_ones_parse_generate_takes() -> None:
    assert "additionalProperties" not in SCHEMAS["GenerateRequest"]  # unknown fields are ignored (SGLang's)
    prompts = ("text", "input_ids")
    nulls = {name: None for name in _optional("GenerateRequest") if name not in prompts}
    assert len(parse_generate({"text": "hi", **nulls}).prompts) == 1
    assert parse_generate({"text": "hi", "not_a_field": 1}).prompts[0].prompt == "hi"


def _tokenize(server: FakeServer, body: Any) -> Any:
    return token_routes.tokenize(server, body)  # type: ignore[arg-type]


def _detokenize(server: FakeServer, body: Any) -> Any:
    return token_routes.detokenize(server, body)  # type: ignore[arg-type]


def _abort(server: FakeServer, body: Any) -> Any:
    return native_api.abort_request(server, body, "")  # type: ignore[arg-type]


@pytest.mark.parametrize("schema, route, null_base", [
    ("TokenizeRequest", _tokenize, {"prompt": "hi"}),
    ("DetokenizeRequest", _detokenize, {"tokens": [1]}),
    ("AbortRequest", _abort, {"rid": "r", "abort_all": True}),
])
def test_token_and_abort_routes_take_null_where_documented(schema: str, route: Any,
                                                            null_base: dict[str, Any]) -> None:
    assert SCHEMAS[schema]["additionalProperties"] is False
    with pytest.raises(InvalidRequest) as info:
        asyncio.run(route(FakeServer(), {**null_base, "extra": 1}))
    assert info.value.param == "extra"
    for name, prop in _optional(schema).items():
        with_null = {**null_base, name: None}
        if _accepts_null(prop):
            asyncio.run(route(FakeServer(), with_null))
        else:
            with pytest.raises(InvalidRequest) as info:
                asyncio.run(route(FakeServer(), with_null))
            assert info.value.param == name


def test_openai_bodies_take_every_sampling_field() -> None:
    for name in ("CompletionRequest", "ChatCompletionRequest"):
        assert SCHEMAS[name]["additionalProperties"] is False
        assert set(SAMPLING_FIELDS) <= set(_props(name)), name
    params = {f.name for f in fields(SamplingParams)}
    assert {SAMPLING_NAMES.get(n, n) for n in SAMPLING_FIELDS} <= params


def _nulls(schema: str) -> dict[str, None]:
    return {k: None for k, v in _optional(schema).items() if _accepts_null(v)}


@pytest.mark.parametrize("schema", ["CompletionRequest", "ChatCompletionRequest"])
def test_null_is_accepted_where_documented_and_refused_elsewhere(schema: str) -> None:
    if schema == "CompletionRequest":
        req = parse_completion({"prompt": "hi", **_nulls(schema)}, "m").req
    else:
        req = parse_chat({"messages": CHAT, **_nulls(schema)}, ServerConfig(), "m").req
    for prompt in req.prompts:  # the manager takes what nulls became
        SamplingParams.from_dict(prompt.sampling).validate(1000)
    assert [k for k, v in _optional(schema).items() if not _accepts_null(v)] == []


# ---------------------------------------------------------------- the route


def _get_document(config: ServerConfig, headers: dict[str, str]) -> tuple[int, dict[str, Any]]:
    async def run() -> tuple[int, dict[str, Any]]:
        server = ServerState(config)
        server.attach(FakeManager())  # type: ignore[arg-type]
        async with TestClient(TestServer(create_app(server))) as client:
            resp = await client.get("/openapi.json", headers=headers)
            return resp.status, await resp.json()

    return asyncio.run(run())


def test_the_route_serves_the_document() -> None:
    status, doc = _get_document(ServerConfig(max_n=3), {})
    assert status == 200 and doc == DOC


def test_the_route_needs_the_key_and_passes_the_browser_guard() -> None:
    keyed = ServerConfig(api_key="k")
    assert _get_document(keyed, {})[0] == 401
    status, doc = _get_document(keyed, {"Authorization": "Bearer k"})
    assert status == 200 and doc["security"] == [{"bearer": []}] and doc == document(api_key=True)
    status, body = _get_document(ServerConfig(), {"Origin": "https://evil.example"})
    assert status == 403 and body["error"]["type"] == "permission_error"
