"""JSON text of a value a client sent (a schema, tool parameters): a 400 naming the field, not a
500, when the value is nested deeper than the serializer can follow.

orjson parses bodies up to 1024 levels deep, but the stdlib `json.dumps` that re-serializes them
recurses once per level and raises RecursionError near Python's limit (~1000).
"""

from __future__ import annotations

import json
from typing import Any

from runtime.contracts.errors import InvalidRequest


def client_json(value: Any, param: str, **dumps_kwargs: Any) -> str:
    try:
        return json.dumps(value, **dumps_kwargs)
    except RecursionError:
        raise InvalidRequest(f"{param} is nested too deeply", param=param) from None
    except (TypeError, ValueError) as exc:
        raise InvalidRequest(f"{param} cannot be written as JSON: {exc}", param=param) from None
