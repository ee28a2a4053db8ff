"""Who a request belongs to: what it may abort, and which stored responses it may read.

The owner is a digest of the bearer token the request presented (any string on a key-less
server, so that distinct clients' keys still separate them) and, for stored responses, its cache
salt. Hashed, so that nothing the server keeps holds a key. NUL-joined: ("a", "bc") and
("ab", "c") stay apart.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping


def owner_key(authorization: str, salt: str | None = None) -> str:
    """The owner of a request with this Authorization header and cache salt."""
    scheme, _, token = authorization.partition(" ")
    bearer = token.strip() if scheme.lower() == "bearer" else ""
    raw = bearer + "\x00" + (salt if salt is not None else "\x01")
    return hashlib.sha256(raw.encode("utf-8", "surrogatepass")).hexdigest()


def request_owner(headers: Mapping[str, str], salt: str | None = None) -> str:
    """The owner of an HTTP request: its bearer token, else its `x-api-key` (Anthropic's clients)."""
    authorization = headers.get("Authorization", "")
    if not authorization.partition(" ")[2].strip() and headers.get("x-api-key"):
        authorization = "Bearer " + headers["x-api-key"]
    return owner_key(authorization, salt)
