"""Field specs: each route's body declared once, as pydantic models, and from that declaration its
validator, its errors and its schema (`/openapi.json`, `tokenizer/openapi.py`).

    class ChatBody(Spec):
        messages: Annotated[list[Message], Length(1, 2048)]
        temperature: Annotated[float, Field(ge=0, le=2)] | None = None

    body = parse(ChatBody, raw, style=BRACKETS)     # InvalidRequest naming the field, or the model

Rules every spec follows, so that no later code meets a value it cannot handle:
  - Strict types at every depth: no coercion ("1" is not an integer, 1 is not a boolean).
  - Unknown fields are refused by default (`Spec`); `Echo` models, for content a client echoes
    back from the protocol's own responses, ignore the fields they do not use instead.
  - Every list and string has a bound. `Length` checks it before any element is looked at, so a
    list of millions of elements costs one `len()`; pydantic's own `max_length` is checked only
    after every element was validated.
  - Free JSON (a JSON schema, tool arguments) is `JsonBounds`: walked iteratively, up to a depth
    and a total size (`json_bounds`), and refused past them without walking the rest.

An error names the full path of the field in the protocol's own style (`messages[0].content` or
`messages.0.content`), found by walking the body along pydantic's error location, so union and
validator tags in that location never reach the client.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, TypeVar

from pydantic import BaseModel, BeforeValidator, ConfigDict, GetCoreSchemaHandler, GetJsonSchemaHandler, ValidationError
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import CoreSchema, PydanticCustomError, core_schema

from runtime.contracts.errors import InvalidRequest
from tokenizer.core.json_bounds import Bounds, describe, find_problem

M = TypeVar("M", bound=BaseModel)


class Spec(BaseModel):
    """A request body or object: strict types, unknown fields refused."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True, hide_input_in_errors=True)


class Echo(BaseModel):
    """An object a client echoes from this protocol's answers: unused fields are ignored."""

    model_config = ConfigDict(extra="ignore", strict=True, frozen=True, hide_input_in_errors=True)


@dataclass(frozen=True, slots=True)
class Length:
    """`Annotated[list[T], Length(0, 8)]` or `Annotated[str, Length(1, 64)]`: the length is
    checked before anything else (pydantic's own max_length only after every item), and the
    JSON schema carries it (minItems/maxItems, minLength/maxLength)."""

    low: int
    high: int

    def __get_pydantic_core_schema__(self, source: Any, handler: GetCoreSchemaHandler) -> CoreSchema:
        inner = handler(source)
        if inner["type"] == "list":  # NOTE: stop at the first bad item; a million bad items
            inner = {**inner, "fail_fast": True}  # would each make an error (seconds of the loop)
        return core_schema.no_info_before_validator_function(self._check, inner)

    def __get_pydantic_json_schema__(self, schema: CoreSchema, handler: GetJsonSchemaHandler) -> JsonSchemaValue:
        out = handler(schema)
        keys = _LENGTH_KEYS.get(str(out.get("type")), ("minItems", "maxItems"))
        return {**out, keys[0]: self.low, keys[1]: self.high}

    def _check(self, value: Any) -> Any:
        if isinstance(value, (list, str, dict)) and not self.low <= len(value) <= self.high:
            what = "characters" if isinstance(value, str) else "entries" if isinstance(value, dict) else "items"
            raise PydanticCustomError("length", f"must hold {self.low} to {self.high} {what}, got {len(value)}")
        return value


_TAG_ERRORS = ("union_tag_invalid", "union_tag_not_found")
MAX_KEY_CHARS = 64  # the longest key an error names (field names, tool and variable names)
_LENGTH_KEYS = {"string": ("minLength", "maxLength"), "object": ("minProperties", "maxProperties")}


@dataclass(frozen=True, slots=True)
class JsonBounds:
    """`Annotated[Any, JsonBounds(bounds)]`: free JSON within `bounds` (depth, string length,
    total size), walked iteratively and refused past them; `object_only`: a JSON object."""

    bounds: Bounds
    object_only: bool = False

    def __get_pydantic_core_schema__(self, source: Any, handler: GetCoreSchemaHandler) -> CoreSchema:
        return core_schema.no_info_plain_validator_function(self._check)

    def __get_pydantic_json_schema__(self, schema: CoreSchema, handler: GetJsonSchemaHandler) -> JsonSchemaValue:
        return {"type": "object"} if self.object_only else {}

    def _check(self, value: Any) -> Any:
        if self.object_only and not isinstance(value, dict):
            raise PydanticCustomError("object_type", f"must be an object, got {describe(value)}")
        problem = find_problem(value, self.bounds)
        if problem is not None:
            raise PydanticCustomError("json_bounds", problem)
        return value


NAME = Annotated[str, Length(1, 256)]  # ids, names and labels
NOT_A_STRING = "<not a string>"


def string_tag(key: str) -> BeforeValidator:
    """`Annotated[A | B, Field(discriminator=key), string_tag(key)]`: a tag that is not a string
    reaches pydantic as NOT_A_STRING, a wrong tag naming the field. NOTE: pydantic formats a tag
    it cannot look up, and a list nested ~1000 deep (orjson reads 1024) overflows the stack there."""

    def plain(value: Any) -> Any:
        if isinstance(value, dict) and key in value and not isinstance(value[key], str):
            return {**value, key: NOT_A_STRING}
        return value

    return BeforeValidator(plain)


# ---------------------------------------------------------------- errors


@dataclass(frozen=True, slots=True)
class PathStyle:
    """How a protocol writes a field's path: OpenAI `a[0].b`, Anthropic `a.0.b`."""

    index: str  # with {i}

    def join(self, keys: list[str | int]) -> str:
        out = ""
        for key in keys:
            out += self.index.format(i=key) if isinstance(key, int) else (f".{key}" if out else str(key))
        return out


BRACKETS = PathStyle("[{i}]")
DOTS = PathStyle(".{i}")


def parse(model: type[M], body: Any, style: PathStyle = BRACKETS) -> M:
    """`body` as `model`, or `InvalidRequest` naming the first bad field."""
    if not isinstance(body, dict):
        raise InvalidRequest(f"the request body must be a JSON object, got {describe(body)}")
    try:
        return model.model_validate(body)
    except ValidationError as exc:
        raise spec_error(exc, body, style) from None


def spec_error(exc: ValidationError, body: Any, style: PathStyle) -> InvalidRequest:
    """The error of the deepest failure (for a union: the member that got furthest). At equal
    depth: a value out of range over a value of another type, then the list member whose first
    bad item comes latest (`[1, "a"]` as ids or texts: item 1 is no id, rather than item 0 no
    text), as those name the member the client meant."""
    errors = exc.errors(include_url=False, include_input=False)
    first_bad: dict[tuple[Any, ...], int] = {}  # per list (and union member): its first bad item
    for error in errors:
        loc = error["loc"]
        if loc and isinstance(loc[-1], int):
            first_bad[loc[:-1]] = min(first_bad.get(loc[:-1], loc[-1]), loc[-1])
    best: tuple[list[str | int], str] | None = None
    best_rank = (-1, False, -1)
    for error in errors:
        loc = error["loc"]
        path = body_path(body, loc, missing=error["type"] == "missing")
        message = _message(error["type"], error["msg"])
        if error["type"] in _TAG_ERRORS:  # the discriminating field (type, role) is the bad one
            ctx = error.get("ctx") or {}
            tag = str(ctx.get("discriminator", "type")).strip("'")
            path.append(tag if tag.isidentifier() else "type")  # a callable's name ("kind()") is no field
            message = (f"must be one of {ctx['expected_tags']}, got {describe(str(ctx.get('tag')))}"
                       if "expected_tags" in ctx else "this field is required")
        progress = first_bad[loc[:-1]] if loc and isinstance(loc[-1], int) else -1
        rank = (len(path), not error["type"].endswith("_type"), progress)
        if rank > best_rank:
            best, best_rank = (path, message), rank
    assert best is not None, "a ValidationError carries at least one error"
    path, message = best
    param = style.join(path) if path else None
    return InvalidRequest(f"{param}: {message}" if param else message, param=param)


def body_path(body: Any, loc: tuple[Any, ...], missing: bool = False) -> list[str | int]:
    """The keys of `loc` that exist in `body`, followed from its root: pydantic's location also
    holds union members' and validators' tags (`str`, `list[...]`, a discriminator's value), which
    name no field. A tag that is also a key of the object it sits in (a text block's tag `text`)
    could be read either way: the reading that follows more of `loc`, and at a tie the one that
    reaches further along it, wins. For a missing field, its name ends the path. A key longer
    than MAX_KEY_CHARS (no field's name) is named by its parent, so an error never echoes a
    client's megabyte key."""
    path = _follow(body, loc, 0)[0]
    if missing and loc and isinstance(loc[-1], str) and (not path or path[-1] != loc[-1]):
        path.append(loc[-1])
    return path


def _follow(node: Any, loc: tuple[Any, ...], i: int) -> tuple[list[str | int], int]:
    """(the best path through `node` along `loc[i:]`, each key taken or skipped as a tag; the
    index in `loc` of its last key, -1 for none)."""
    while i < len(loc) and not _holds(node, loc[i]):
        i += 1
    if i == len(loc) or (isinstance(loc[i], str) and len(loc[i]) > MAX_KEY_CHARS):
        return [], -1
    key = loc[i]
    rest, last = _follow(node[key], loc, i + 1)
    taken = ([key, *rest], max(last, i))
    skipped = _follow(node, loc, i + 1)
    return taken if (len(taken[0]), taken[1]) >= (len(skipped[0]), skipped[1]) else skipped


def _holds(node: Any, key: Any) -> bool:
    if isinstance(node, dict):
        return isinstance(key, str) and key in node
    return isinstance(node, list) and isinstance(key, int) and 0 <= key < len(node)


def _message(kind: str, msg: str) -> str:
    if kind == "missing":
        return "this field is required"
    if kind == "extra_forbidden":
        return "unknown field (not part of this API's request)"
    return msg[:1].lower() + msg[1:]
