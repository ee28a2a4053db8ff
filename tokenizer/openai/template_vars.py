"""A chat request's say in its chat template: `chat_template_kwargs` carries template variables
only, and a request's own template (`chat_template`) is accepted only from a server started with
--trust-request-chat-template (as vLLM and SGLang accept it).

    variables, template = check_template_kwargs(req, trust=False)

- A key is a template variable's name: identifier-like (letters, digits, `_`, at most 64) and not
  a parameter of transformers' `apply_chat_template` (`tokenizer.chat_template.reserved_names`):
  a 400 naming `chat_template_kwargs.<key>` otherwise.
- A value is small plain JSON (`VAR_BOUNDS`): models read flags and short strings
  (`enable_thinking`, `reasoning_effort`), not documents.
- `chat_template`, in `chat_template_kwargs` or as a top-level field: without the flag a 400
  naming where it was; with it, a string of at most `MAX_TEMPLATE_CHARS` that
  `tokenizer.chat_template` renders in a killable helper process.
"""

from __future__ import annotations

import re
from typing import Any

from runtime.contracts.errors import InvalidRequest
from tokenizer.chat_template import RequestTemplate, reserved_names
from tokenizer.openai.json_bounds import Bounds, check_text, check_value, describe

KWARGS = "chat_template_kwargs"
TEMPLATE = "chat_template"
MAX_TEMPLATE_CHARS = 64 * 1024
VAR_BOUNDS = Bounds(max_depth=8, max_string=16 * 1024, max_total=64 * 1024)
_ALL_VARS = Bounds(max_depth=VAR_BOUNDS.max_depth + 1, max_total=VAR_BOUNDS.max_total)
_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}")
_UNTRUSTED = ("is not accepted: this server renders its own chat template only (an operator "
              "can allow a request's template with --trust-request-chat-template)")


def check_template_kwargs(req: dict[str, Any],
                          trust: bool) -> tuple[dict[str, Any], RequestTemplate | None]:
    """(the template variables, the request's template or None) of a chat request."""
    kwargs = req.get(KWARGS)
    if kwargs is not None and not isinstance(kwargs, dict):
        raise InvalidRequest(f"{KWARGS} must be an object, got {describe(kwargs)}", param=KWARGS)
    variables: dict[str, Any] = {}
    template = _template(req.get(TEMPLATE), TEMPLATE, trust)
    for key, value in (kwargs or {}).items():
        where = _key_param(key)
        if key == TEMPLATE:
            if template is not None and value is not None:
                raise InvalidRequest(f"give {TEMPLATE} once, not also in {KWARGS}", param=where)
            template = template or _template(value, where, trust)
            continue
        if key in reserved_names():
            raise InvalidRequest(f"{where} is a parameter of apply_chat_template, not a template "
                                 "variable: only variables a template reads (such as "
                                 "enable_thinking) are accepted", param=where)
        check_value(value, where, VAR_BOUNDS)
        variables[key] = value
    check_value(variables, KWARGS, _ALL_VARS)  # the whole, besides each value
    return variables, template


def _key_param(key: Any) -> str:
    """`chat_template_kwargs.<key>` for an identifier-like key; a 400 otherwise."""
    if not isinstance(key, str) or not _KEY.fullmatch(key):
        raise InvalidRequest(f"{KWARGS} keys must be template variable names (letters, digits and "
                             f"_, not starting with a digit, at most 64), got {describe(key)}",
                             param=KWARGS)
    return f"{KWARGS}.{key}"


def _template(value: Any, param: str, trust: bool) -> RequestTemplate | None:
    """A request's template given at `param` (None when absent)."""
    if value is None:
        return None
    if not trust:
        raise InvalidRequest(f"{param} {_UNTRUSTED}", param=param)
    if not isinstance(value, str) or not value.strip():
        raise InvalidRequest(f"{param} must be a non-empty string (a Jinja chat template)",
                             param=param)
    if len(value) > MAX_TEMPLATE_CHARS:
        raise InvalidRequest(f"{param} is {len(value)} characters; the limit is "
                             f"{MAX_TEMPLATE_CHARS}", param=param)
    check_text(value, param)
    return RequestTemplate(value, param)
