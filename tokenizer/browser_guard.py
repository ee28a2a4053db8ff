"""Browser safety, as local servers do it: which web pages may drive this server.

A key-less server on 127.0.0.1 is reachable by every page the user visits. Three checks, run on
every route (/health included) before the API key and before any body is read:

1. **Origin.** A request with an `Origin` header must come from `--allowed-origins` (default: the
   loopback pages, http(s)://localhost, 127.0.0.1 and [::1] on any port; `*` allows every page).
   Others get 403; an allowed one gets CORS headers (`Access-Control-Allow-Origin: <origin>`,
   `Vary: Origin`) and its OPTIONS preflight a 204. `Origin: null` (sandboxed frames, file://
   pages) is refused unless `*`: any site can make a sandboxed frame send it. Browsers send
   Origin on every cross-origin POST, `no-cors` ones included, so the untyped body a page can send
   without a preflight (a `Blob`, which `_json_body` reads as JSON for curl and raw clients)
   is refused here unless the page is allowed.
2. **Host.** While bound to a loopback address the `Host` must be a loopback name (localhost,
   a name under .localhost, 127.0.0.0/8, [::1]; any port): a DNS-rebinding page reaches us under
   its own name, and its same-origin GETs carry no Origin. Names under .localhost are accepted
   because browsers resolve them to loopback themselves and no public DNS can answer for them.
   Bound to 0.0.0.0 or another address the server is meant to be reached under other names, so
   Host is not checked (use --api-key there).
3. **Sec-Fetch.** A cross-site or same-site request *without* Origin (an image, script, frame or
   `no-cors` GET) is refused unless it is a top-level navigation (`Sec-Fetch-Mode: navigate`,
   `Sec-Fetch-Dest: document`, a link the user follows) or origins are `*`. A page gets nothing
   from such a request but its side effect (/health_generate runs a generation) or a probe.
   A cross-site `no-cors` request *with* an allowed Origin is not refused: that page may use
   CORS anyway. Non-browser clients send neither Origin nor Sec-Fetch-*, so none of this
   touches curl, SDKs, load balancers or health probes.

/health is not exempt: answered to a foreign page it tells that page a model server runs here
and when it is ready; health probes are not browsers and are unaffected.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import NamedTuple

from aiohttp import web

from runtime.contracts.config import ServerConfig
from tokenizer.errors import Handler, HTTPError, Middleware

ALLOW_METHODS = "GET, POST, PUT, DELETE, OPTIONS"
ALLOW_HEADERS = "Content-Type, Authorization, x-api-key, anthropic-version"
PREFLIGHT_MAX_AGE_S = 600
DEFAULT_PORTS = {"http": "80", "https": "443"}
ANY_PORT = "*"
# Sec-Fetch-Site values that mean "another page than our own" (the others: same-origin, none).
FOREIGN_SITES = frozenset({"cross-site", "same-site"})
PrepareHook = Callable[[web.Request, web.StreamResponse], Awaitable[None]]


class OriginRule(NamedTuple):
    """One --allowed-origins entry: `port` is "" for the scheme's default, "*" for any."""

    scheme: str
    host: str
    port: str


def _split_host_port(value: str) -> tuple[str, str] | None:
    """("host", "port") of `host`, `host:port`, `[v6]` or `[v6]:port`; None when malformed."""
    if value.startswith("["):
        end = value.find("]")
        host, rest = value[: end + 1], value[end + 1:]
        if end < 0 or (rest and not rest.startswith(":")):
            return None
        port = rest[1:]
    else:
        host, _, port = value.partition(":")
    if not host or (port and port != ANY_PORT and not port.isdigit()):
        return None
    return host, port


def parse_origin(origin: str, pattern: bool = False) -> OriginRule | None:
    """`scheme://host[:port]` (lower-cased, a default port dropped; port `*` only in a `pattern`,
    an --allowed-origins entry); None for anything else."""
    scheme, sep, rest = origin.strip().lower().partition("://")
    if not sep or not scheme or any(c in rest for c in "/?#@ "):
        return None
    parts = _split_host_port(rest)
    if parts is None or (parts[1] == ANY_PORT and not pattern):
        return None
    host, port = parts
    return OriginRule(scheme, host, "" if DEFAULT_PORTS.get(scheme) == port else port)


def is_loopback_name(host: str) -> bool:
    """localhost, a name under .localhost, or an address in 127.0.0.0/8 or ::1 (brackets allowed)."""
    name = host.lower().rstrip(".")
    if name == "localhost" or name.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(name.removeprefix("[").removesuffix("]")).is_loopback
    except ValueError:
        return False


def is_loopback_host_header(value: str) -> bool:
    """Whether a `Host` header names this machine's loopback (any port)."""
    parts = _split_host_port(value.strip())
    return parts is not None and parts[1] != ANY_PORT and is_loopback_name(parts[0])


@dataclass(frozen=True)
class BrowserGuard:
    """The three checks for one server (see the module docstring)."""

    allow_all: bool
    rules: tuple[OriginRule, ...]
    check_host: bool
    bind_host: str

    @classmethod
    def from_config(cls, config: ServerConfig) -> BrowserGuard:
        entries = tuple(config.allowed_origins)
        rules = tuple(rule for rule in (parse_origin(e, pattern=True) for e in entries) if rule is not None)
        return cls("*" in entries, rules, is_loopback_name(config.host), config.host)

    def origin_allowed(self, origin: str) -> bool:
        if self.allow_all:
            return True
        rule = parse_origin(origin)
        return rule is not None and any(_matches(allowed, rule) for allowed in self.rules)

    def check(self, request: web.Request) -> None:
        """Raise a 403 HTTPError naming what is refused; return for an acceptable request."""
        host = request.headers.get("Host")
        if self.check_host and host is not None and not is_loopback_host_header(host):
            raise HTTPError(403, f"Host {host!r} is not a loopback name: while bound to {self.bind_host} "
                                 "the server answers only Host localhost, *.localhost, 127.x.x.x or [::1] "
                                 "(a DNS-rebinding defence); bind --host 0.0.0.0 to be reached by other names.")
        origin = request.headers.get("Origin")
        if origin is not None and not self.origin_allowed(origin):
            raise HTTPError(403, _origin_message(origin))
        if origin is None and not self.allow_all and _foreign_background_fetch(request):
            raise HTTPError(403, "A cross-site browser request without Origin (an image, script, frame "
                                 "or no-cors fetch) is refused; call the API with fetch() in cors mode "
                                 "from a page in --allowed-origins.")

    def cors_headers(self, origin: str) -> dict[str, str]:
        """The headers a preflight from an allowed `origin` is answered with."""
        return {"Access-Control-Allow-Origin": origin, "Access-Control-Allow-Methods": ALLOW_METHODS,
                "Access-Control-Allow-Headers": ALLOW_HEADERS,
                "Access-Control-Max-Age": str(PREFLIGHT_MAX_AGE_S), "Vary": "Origin"}


def _matches(allowed: OriginRule, origin: OriginRule) -> bool:
    return (allowed.scheme, allowed.host) == (origin.scheme, origin.host) and allowed.port in (
        ANY_PORT, origin.port)


def _origin_message(origin: str) -> str:
    if origin.strip().lower() == "null":
        return ("Origin 'null' (a sandboxed frame or a file:// page) is not allowed; only "
                "--allowed-origins '*' allows it.")
    return (f"Origin {origin!r} is not allowed to call this server; start it with "
            f"--allowed-origins {origin} (plus the defaults you want to keep) to allow that page.")


def _foreign_background_fetch(request: web.Request) -> bool:
    """A request another site's page made without the user navigating to us."""
    headers = request.headers
    if headers.get("Sec-Fetch-Site", "").lower() not in FOREIGN_SITES:
        return False
    navigation = (headers.get("Sec-Fetch-Mode", "").lower() == "navigate"
                  and headers.get("Sec-Fetch-Dest", "document").lower() == "document")
    return not navigation


def _is_preflight(request: web.Request) -> bool:
    return (request.method == "OPTIONS" and "Origin" in request.headers
            and "Access-Control-Request-Method" in request.headers)


def guard_middleware(guard: BrowserGuard) -> Middleware:
    """Run `guard.check` first (inside error_middleware, before auth and readiness) and answer
    an allowed CORS preflight with 204 (preflights carry no API key)."""

    @web.middleware
    async def check_browser(request: web.Request, handler: Handler) -> web.StreamResponse:
        guard.check(request)
        if _is_preflight(request):
            return web.Response(status=204, headers=guard.cors_headers(request.headers["Origin"]))
        return await handler(request)

    return check_browser


def cors_hook(guard: BrowserGuard) -> PrepareHook:
    """An `on_response_prepare` hook: `Vary: Origin` on every response, and the allowed page's
    origin in Access-Control-Allow-Origin (a hook, not the middleware: a stream's headers are
    sent inside its handler)."""

    async def add_cors(request: web.Request, response: web.StreamResponse) -> None:
        vary = response.headers.get("Vary", "")
        if "origin" not in vary.lower():
            response.headers["Vary"] = f"{vary}, Origin" if vary else "Origin"
        origin = request.headers.get("Origin")
        if origin is not None and guard.origin_allowed(origin):
            response.headers.setdefault("Access-Control-Allow-Origin", origin)

    return add_cors
