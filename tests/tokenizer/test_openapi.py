"""The OpenAPI document (tokenizer/openapi.py, openapi_bodies.py) against the code it describes:
the routes `create_app` serves, the fields and ranges the validators accept, the error shape,
and the route itself (in-process app, fake manager). The live server meets schemathesis in
test_fuzz_schemathesis.py."""

from __future__ import annotations

import asyncio
import dataclasses
import json
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
from tokenizer.errors import error_body
from tokenizer.generate_body import SingleRequest, normalize_generate
from tokenizer.http_server import create_app
from tokenizer.limits import RequestLimits, check_request
from tokenizer.openai import constraints, protocol, template_vars
from tokenizer.openapi import SchemaLimits, document
from tokenizer.openapi_bodies import INT64_MAX, TEMPLATE_VAR_PATTERN, TOOL_NAME_PATTERN
from tokenizer.server_state import ServerState

LIMITS = SchemaLimits(token_budget=2048, vocab_size=1000, max_n=4, max_top_logprobs=20,
                      max_prompts=8, api_key=False)
DOC = document(LIMITS)
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


# ---------------------------------------------------------------- the document


@pytest.mark.parametrize("api_key", [False, True])
def test_the_document_is_valid_openapi_3_1(api_key: bool) -> None:
    doc = document(dataclasses.replace(LIMITS, api_key=api_key))
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
    doc = document(dataclasses.replace(LIMITS, api_key=True))
    assert doc["security"] == [{"bearer": []}]
    assert doc["components"]["securitySchemes"]["bearer"]["scheme"] == "bearer"
    assert doc["paths"]["/health"]["get"]["security"] == []
    assert "401" not in doc["paths"]["/health"]["get"]["responses"]
    assert "401" in doc["paths"]["/openapi.json"]["get"]["responses"]
    assert "security" not in DOC and "401" not in DOC["paths"]["/generate"]["post"]["responses"]


def test_the_servers_caps_are_the_bounds() -> None:
    sampling = _props("SamplingParams")
    assert sampling["max_new_tokens"]["maximum"] == LIMITS.token_budget - 1
    assert sampling["n"]["maximum"] == LIMITS.max_n
    assert sampling["stop_token_ids"]["items"]["maximum"] == LIMITS.vocab_size - 1
    assert _props("CompletionRequest")["logprobs"]["maximum"] == LIMITS.max_top_logprobs
    text = _props("GenerateRequest")["text"]["anyOf"][1]
    assert text["maxItems"] == LIMITS.max_prompts


def test_copied_patterns_are_the_validators() -> None:
    assert f"^{constraints._NAME.pattern}$" == TOOL_NAME_PATTERN
    assert f"^{template_vars._KEY.pattern}$" == TEMPLATE_VAR_PATTERN


# ---------------------------------------------------------------- sampling parameters


def test_sampling_params_are_the_fields_from_dict_accepts() -> None:
    props = _props("SamplingParams")
    assert set(props) == {f.name for f in fields(SamplingParams)} | {"sampling_seed"}
    assert SCHEMAS["SamplingParams"]["additionalProperties"] is False
    assert all(_accepts_null(p) for p in props.values())
    nulls = {name: None for name in props if name != "sampling_seed"}
    assert SamplingParams.from_dict(nulls) == SamplingParams()


SAMPLES = {"integer": 1, "number": 0.5, "boolean": True, "string": "x", "array": [], "object": {}}


@pytest.mark.parametrize("name", sorted(_props("SamplingParams")))
def test_documented_types_are_the_types_from_dict_accepts(name: str) -> None:
    validator = jsonschema_rs.validator_for(_props("SamplingParams")[name])
    for kind, value in SAMPLES.items():
        try:
            SamplingParams.from_dict({name: value})
            accepted = True
        except InvalidRequest:
            accepted = False
        assert validator.is_valid(value) == accepted, (name, kind)


def _bound_cases(prop: dict[str, Any], integer: bool = False) -> list[tuple[Any, bool]]:
    """(value, documented as accepted) at and past each numeric bound of `prop` and its anyOf."""
    integer = integer or "integer" in str(prop.get("type"))
    step = 1 if integer else 1e-6
    cases: list[tuple[Any, bool]] = []
    for key, inside, outside in (("minimum", 0, -step), ("maximum", 0, step),
                                 ("exclusiveMinimum", step, 0), ("exclusiveMaximum", -step, 0)):
        if key in prop and prop[key] != INT64_MAX:  # INT64_MAX: what JSON readers keep
            cases += [(prop[key] + inside, True), (prop[key] + outside, False)]
    if "const" in prop:
        cases.append((prop["const"], True))
    for alt in prop.get("anyOf", []):
        cases += _bound_cases(alt, integer)
    return cases


def _request_accepted(name: str, value: Any) -> bool:
    """Through `SamplingParams` and `check_request`, with a one-token prompt."""
    lim = RequestLimits(vocab_size=LIMITS.vocab_size, context_length=LIMITS.token_budget,
                        kv_total=None, max_n=LIMITS.max_n, max_top_logprobs=LIMITS.max_top_logprobs)
    body = {name: value, **({"max_new_tokens": LIMITS.token_budget - 1}
                            if name == "min_new_tokens" else {})}
    try:
        params = SamplingParams.from_dict(body)
        check_request(SingleRequest(rid="r", input_ids=[1]), [1], params, lim)
    except InvalidRequest as exc:
        assert exc.param == ("seed" if name == "sampling_seed" else name), exc
        return False
    return True


@pytest.mark.parametrize("name", sorted(_props("SamplingParams")))
def test_documented_ranges_are_the_validators(name: str) -> None:
    for value, documented in _bound_cases(_props("SamplingParams")[name]):
        assert _request_accepted(name, value) == documented, (name, value)
    if name == "seed":
        assert _request_accepted("seed", INT64_MAX) and not _request_accepted("seed", INT64_MAX + 1)


# ---------------------------------------------------------------- request bodies


class Recording(dict[str, Any]):
    """A body that notes every key a validator reads."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.read: set[str] = set()

    def get(self, key: str, default: Any = None) -> Any:
        self.read.add(key)
        return super().get(key, default)

    def __getitem__(self, key: str) -> Any:
        self.read.add(key)
        return super().__getitem__(key)

    def __contains__(self, key: object) -> bool:
        self.read.add(str(key))
        return super().__contains__(key)


class FakeManager:
    scheduler_info: ClassVar[dict[str, int]] = {"vocab_size": 10}

    class encoder:  # the manager's attribute
        @staticmethod
        async def encode_texts(prompts: list[str], add_special: bool) -> list[list[int]]:
            return [[1] for _ in prompts]

        @staticmethod
        async def decode(seqs: list[list[int]], skip_special_tokens: bool = False) -> list[str]:
            return ["x" for _ in seqs]

    async def abort(self, rid: str) -> None: ...

    async def abort_all(self) -> None: ...


class FakeServer:
    config = ServerConfig()

    def manager(self) -> FakeManager:
        return FakeManager()


def test_generate_fields_are_the_keys_normalize_generate_reads() -> None:
    body = Recording({"text": "hi"})
    normalize_generate(body)
    assert body.read == set(_props("GenerateRequest"))
    prompts = ("text", "input_ids")
    nulls = {name: None for name in _optional("GenerateRequest") if name not in prompts}
    assert len(normalize_generate({"text": "hi", **nulls}).requests) == 1


@pytest.mark.parametrize("schema, route, body, null_base", [
    ("TokenizeRequest", token_routes.tokenize, {"prompt": "hi"}, {"prompt": "hi"}),
    ("DetokenizeRequest", token_routes.detokenize, {"tokens": [1]}, {"tokens": [1]}),
    ("AbortRequest", native_api.abort_request, {"rid": "r"}, {"abort_all": True}),
])
def test_token_and_abort_fields_are_the_keys_their_routes_read(
        schema: str, route: Any, body: dict[str, Any], null_base: dict[str, Any]) -> None:
    recording = Recording(body)
    asyncio.run(route(FakeServer(), recording))
    ignored = {"model"} & set(_props(schema))  # documented as accepted and ignored
    assert recording.read == set(_props(schema)) - ignored
    for name, prop in _optional(schema).items():
        if name in ignored:
            continue
        with_null = {**null_base, name: None}
        if _accepts_null(prop):
            asyncio.run(route(FakeServer(), with_null))
        else:
            with pytest.raises(InvalidRequest):
                asyncio.run(route(FakeServer(), with_null))


def test_openai_bodies_are_the_protocol_tables() -> None:
    extensions = set(protocol.NEUTRAL_EXTENSIONS)
    assert set(_props("CompletionRequest")) == protocol.COMPLETION_FIELDS | extensions
    assert set(_props("ChatCompletionRequest")) == protocol.CHAT_FIELDS | extensions
    for name in ("CompletionRequest", "ChatCompletionRequest"):
        assert SCHEMAS[name]["additionalProperties"] is False
    for openai_name, ours in protocol.SAMPLING_FIELDS.items():
        assert openai_name in _props("ChatCompletionRequest"), ours


def _nulls(schema: str) -> dict[str, None]:
    return {k: None for k, v in _optional(schema).items() if _accepts_null(v)}


def _plan(schema: str, extra: dict[str, Any]) -> protocol.OpenAIPlan:
    if schema == "CompletionRequest":
        return protocol.plan_completion({"prompt": "hi", **extra}, "m", 20, decode=lambda ids: "")
    return protocol.plan_chat({"messages": CHAT, **extra}, "m", 20, 64,
                              render=lambda messages, kwargs: [1, 2])


@pytest.mark.parametrize("schema", ["CompletionRequest", "ChatCompletionRequest"])
def test_null_is_accepted_where_documented_and_refused_elsewhere(schema: str) -> None:
    plan = _plan(schema, _nulls(schema))
    for single in normalize_generate(plan.body).requests:  # the manager takes what nulls became
        SamplingParams.from_dict(single.sampling_params).validate(LIMITS.vocab_size)
    refused = [k for k, v in _optional(schema).items() if not _accepts_null(v)]
    assert set(refused) == set(protocol.NEUTRAL_EXTENSIONS)
    for name in refused:
        with pytest.raises(InvalidRequest):
            _plan(schema, {name: None})


# ---------------------------------------------------------------- the route


class DocManager:
    """What `SchemaLimits.of` reads from a TokenizerManager."""

    dead_reason: str | None = None
    is_healthy = True
    on_output = None
    on_reject = None
    vocab_size = 1000
    context_length = 512
    scheduler_info: ClassVar[dict[str, int]] = {"max_total_tokens": 256}


def _get_document(config: ServerConfig, headers: dict[str, str]) -> tuple[int, dict[str, Any]]:
    async def run() -> tuple[int, dict[str, Any]]:
        server = ServerState(config)
        server.attach(DocManager())  # type: ignore[arg-type]
        async with TestClient(TestServer(create_app(server))) as client:
            resp = await client.get("/openapi.json", headers=headers)
            return resp.status, await resp.json()

    return asyncio.run(run())


def test_the_route_serves_this_servers_document() -> None:
    config = ServerConfig(max_n=3)
    status, doc = _get_document(config, {})
    assert status == 200
    sampling = doc["components"]["schemas"]["SamplingParams"]["properties"]
    assert sampling["max_new_tokens"]["maximum"] == 255  # the KV pool is smaller than the context
    assert sampling["n"]["maximum"] == 3
    assert doc == document(SchemaLimits(token_budget=256, vocab_size=1000, max_n=3,
                                        max_top_logprobs=config.max_top_logprobs,
                                        max_prompts=config.max_prompts_per_request, api_key=False))


def test_the_route_needs_the_key_and_passes_the_browser_guard() -> None:
    keyed = ServerConfig(api_key="k")
    assert _get_document(keyed, {})[0] == 401
    status, doc = _get_document(keyed, {"Authorization": "Bearer k"})
    assert status == 200 and doc["security"] == [{"bearer": []}]
    status, body = _get_document(ServerConfig(), {"Origin": "https://evil.example"})
    assert status == 403 and body["error"]["type"] == "permission_error"
