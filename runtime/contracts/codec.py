"""The one wire codec for `runtime.contracts.messages`, and a type-keyed dispatcher.

Wire form: the orjson encoding of `[tag, field_1, field_2, ...]`, fields in declaration order
(like msgspec's `array_like` structs). JSON types only, never pickle, so decoding bytes cannot run
code. Consequences of JSON:
  - tuples come back as lists (messages use lists);
  - dict keys must be strings;
  - NaN and +-inf are written as null and decode as None;
  - an object orjson does not know (a numpy int, a tensor, an unregistered dataclass) makes
    `encode` raise `CodecError`.

Nested dataclasses are converted only where a field's annotation says one lives: the plan for
each message class (computed once, from its type hints) lists those field positions, so encoding
a message with long id lists costs one orjson call, not a Python walk over every int. A field may
hold a nested type `T`, `T | None` or `list[T]`, where `T` is registered with `register_nested`
(SamplingParams is, via `to_dict`/`from_dict`) or is itself a registered message.

The decoder trusts the sender beyond the tag and field count: it is meant for the private
per-launch sockets only.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Union

import orjson

from runtime.contracts.messages import MESSAGE_TYPES
from runtime.contracts.sampling import SamplingParams

_Conv = Callable[[Any], Any]


class CodecError(ValueError):
    """A message that cannot be encoded, or bytes that are not a valid message frame."""


_NESTED: dict[type, tuple[_Conv, _Conv]] = {}


def register_nested(cls: type, to_wire: _Conv, from_wire: _Conv) -> None:
    """Allow `cls` inside message fields: `to_wire(obj)` must return JSON types and
    `from_wire(to_wire(obj)) == obj` must hold."""
    _NESTED[cls] = (to_wire, from_wire)


register_nested(SamplingParams, SamplingParams.to_dict, SamplingParams.from_dict)


@dataclass(frozen=True, slots=True)
class _Plan:
    tag: str
    names: tuple[str, ...]
    # (position in the frame, 1-based because the tag is at 0; to-wire, from-wire)
    nested: tuple[tuple[int, _Conv, _Conv], ...]


_PLANS: dict[type, _Plan] = {}


def encode(msg: Any) -> bytes:
    """Encode a registered message to bytes.

    Raises:
        CodecError: unregistered type, or a field value JSON cannot carry.
    """
    frame = _to_frame(msg)
    try:
        return orjson.dumps(frame, option=orjson.OPT_PASSTHROUGH_DATACLASS)
    except TypeError as e:
        raise CodecError(f"cannot encode {frame[0]}: {e}") from None


def decode(data: bytes | bytearray | memoryview) -> Any:
    """Decode bytes made by `encode` back into the message object.

    Raises:
        CodecError: not JSON, not a frame, an unknown tag, or the wrong number of fields.
    """
    try:
        frame = orjson.loads(data)
    except orjson.JSONDecodeError as e:
        raise CodecError(f"message is not valid JSON: {e}") from None
    return _from_frame(frame)


def _to_frame(msg: Any) -> list[Any]:
    plan = _PLANS.get(type(msg)) or _plan_for(type(msg))
    frame: list[Any] = [plan.tag]
    frame.extend([getattr(msg, n) for n in plan.names])
    for pos, to_wire, _ in plan.nested:
        frame[pos] = to_wire(frame[pos])
    return frame


def _from_frame(frame: Any) -> Any:
    if not isinstance(frame, list) or not frame or not isinstance(frame[0], str):
        raise CodecError("message frame must be a JSON array starting with a type tag")
    cls = MESSAGE_TYPES.get(frame[0])
    if cls is None:
        raise CodecError(f"unknown message tag {frame[0]!r}")
    plan = _PLANS.get(cls) or _plan_for(cls)
    if len(frame) != len(plan.names) + 1:
        raise CodecError(f"{plan.tag} has {len(plan.names)} fields, frame has {len(frame) - 1}")
    for pos, _, from_wire in plan.nested:
        frame[pos] = from_wire(frame[pos])
    return cls(*frame[1:])


def _plan_for(cls: type) -> _Plan:
    tag = cls.__name__
    if MESSAGE_TYPES.get(tag) is not cls:
        raise CodecError(f"{tag} is not a registered message type")
    hints = typing.get_type_hints(cls)
    nested = []
    names = []
    for pos, f in enumerate(dataclasses.fields(cls), start=1):
        assert f.init, f"{tag}.{f.name}: init=False fields cannot be decoded positionally"
        names.append(f.name)
        conv = _converter(hints[f.name])
        if conv is not None:
            nested.append((pos, conv[0], conv[1]))
        elif _mentions_dataclass(hints[f.name]):
            raise CodecError(f"{tag}.{f.name}: unsupported nesting {hints[f.name]!r}")
    plan = _Plan(tag, tuple(names), tuple(nested))
    _PLANS[cls] = plan
    return plan


def _converter(tp: Any) -> tuple[_Conv, _Conv] | None:
    """(to_wire, from_wire) for a field type holding a nested dataclass, or None for plain JSON."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (Union, types.UnionType):
        rest = [a for a in args if a is not type(None)]
        inner = _converter(rest[0]) if len(rest) == 1 else None
        if inner is None:
            return None
        enc, dec = inner
        return (lambda v: None if v is None else enc(v)), (lambda v: None if v is None else dec(v))
    if origin is list:
        inner = _converter(args[0])
        if inner is None:
            return None
        enc, dec = inner
        return (lambda v: [enc(x) for x in v]), (lambda v: [dec(x) for x in v])
    if tp in _NESTED:
        return _NESTED[tp]
    if isinstance(tp, type) and MESSAGE_TYPES.get(tp.__name__) is tp:
        return _to_frame, _from_frame
    return None


def _mentions_dataclass(tp: Any) -> bool:
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        return True
    return any(_mentions_dataclass(a) for a in typing.get_args(tp))


class TypeDispatcher:
    """Route a message to the handler registered for its exact type (SGLang's
    TypeBasedDispatcher): `TypeDispatcher({GenerateReq: self.handle_generate, ...})(msg)`."""

    def __init__(self, handlers: dict[type, Callable[[Any], Any]]) -> None:
        self._handlers = dict(handlers)

    def __call__(self, msg: Any) -> Any:
        handler = self._handlers.get(type(msg))
        if handler is None:
            raise TypeError(f"no handler for message type {type(msg).__name__}")
        return handler(msg)
