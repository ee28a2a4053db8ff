"""Where the server's API key comes from, resolved once when `serve()` starts.

`--api-key` is visible to every local user in the process list (/proc/*/cmdline), so the key can
also come from a file or the environment. Precedence: `--api-key`, then `--api-key-file PATH`
(the file's content, surrounding whitespace stripped), then `RADIXSERVE_API_KEY`. A named file
that cannot be read or is empty, or a variable that is set but blank, refuses the start: a
server meant to need a key must not silently run without one. The key then lives in
`config.api_key`, a secret field that `public_dict()` (and so /get_server_info) leaves out.
"""

from __future__ import annotations

from runtime.contracts import env
from runtime.contracts.config import ServerConfig
from runtime.contracts.errors import InvalidRequest


def read_key_file(path: str) -> str:
    """The key in `path`; InvalidRequest naming the file when it is unreadable or blank."""
    try:
        with open(path, encoding="utf-8") as fh:
            key = fh.read().strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise InvalidRequest(f"cannot read the API key file {path}: {exc}", param="api_key_file") from None
    if not key:
        raise InvalidRequest(f"the API key file {path} is empty", param="api_key_file")
    return key


def resolve_api_key(config: ServerConfig) -> ServerConfig:
    """`config` with `api_key` taken from the first source given (see the module docstring)."""
    if config.api_key:
        return config
    if config.api_key_file:
        return config.replace(api_key=read_key_file(config.api_key_file))
    key = env.api_key()
    if key == "":
        raise InvalidRequest(f"{env.PREFIX}API_KEY is set but blank; unset it or give a key", param="api_key")
    return config if key is None else config.replace(api_key=key)
