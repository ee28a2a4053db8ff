"""The /v1/responses store without a server: LRU by count and bytes, the TTL, ownership."""

from __future__ import annotations

from typing import Any

import pytest

from runtime.contracts.errors import InvalidRequest
from tokenizer.openai.responses.store import ResponseStore, owner_key

A, B = owner_key("Bearer key-a", None), owner_key("Bearer key-b", None)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _response(rid: str, text: str = "x") -> dict[str, Any]:
    return {"id": rid, "output": [{"type": "message", "content": [{"text": text}]}]}


def _put(store: ResponseStore, rid: str, owner: str = A, text: str = "x") -> bool:
    ok = store.put(rid, owner, _response(rid, text), [{"type": "message", "role": "user", "content": text}])
    store.check_integrity()
    return ok


def test_count_cap_evicts_the_least_recently_used() -> None:
    store = ResponseStore(max_count=2, max_bytes=1 << 20, ttl=60)
    _put(store, "r1")
    _put(store, "r2")
    assert store.get("r1", A) is not None  # r1 is now the most recently used
    _put(store, "r3")
    assert store.get("r2", A) is None and store.get("r1", A) is not None and store.get("r3", A) is not None
    assert len(store) == 2


def test_bytes_cap_evicts_until_the_new_entry_fits_and_refuses_one_too_big() -> None:
    probe = ResponseStore(max_count=10, max_bytes=1 << 20, ttl=60)
    _put(probe, "p", text="a" * 100)
    size = probe.bytes
    store = ResponseStore(max_count=10, max_bytes=2 * size + size // 2, ttl=60)
    for rid in ("q1", "q2", "q3"):
        _put(store, rid, text="a" * 100)
    assert store.get("q1", A) is None and len(store) == 2 and store.bytes <= store.max_bytes
    assert not _put(store, "huge", text="a" * 10 * size)  # over the cap alone: not stored, nothing evicted
    assert len(store) == 2 and store.get("huge", A) is None


def test_ttl_expires_unused_entries_and_use_refreshes_it() -> None:
    clock = Clock()
    store = ResponseStore(max_count=10, max_bytes=1 << 20, ttl=10, clock=clock)
    _put(store, "old")
    _put(store, "used")
    clock.now = 8
    assert store.get("used", A) is not None  # refreshed: lives until 18
    clock.now = 12
    assert store.get("old", A) is None and store.get("used", A) is not None
    clock.now = 30
    assert store.get("used", A) is None and len(store) == 0 and store.bytes == 0


def test_an_entry_answers_only_to_its_owner() -> None:
    store = ResponseStore(max_count=10, max_bytes=1 << 20, ttl=60)
    _put(store, "r", owner=A)
    assert store.get("r", B) is None and not store.delete("r", B)
    salted = owner_key("Bearer key-a", "tenant-1")
    assert store.get("r", salted) is None and salted != A
    assert store.delete("r", A) and store.get("r", A) is None
    store.start("live", A, {"id": "live"})
    assert store.running("live", B) is None and store.running("live", A) is not None
    store.finish("live")
    assert store.running("live", A) is None


def test_one_owners_traffic_evicts_its_own_conversations_first() -> None:
    """A fills the store past its caps: B's entries stay, A's oldest go; B's next entry then
    takes room from A, the heavier owner, never from B itself."""
    store = ResponseStore(max_count=6, max_bytes=1 << 20, ttl=60)
    for i in range(2):
        _put(store, f"b{i}", B)
    for i in range(20):
        _put(store, f"a{i}", A)
    assert store.get("b0", B) is not None and store.get("b1", B) is not None
    assert store.get("a0", A) is None and store.get("a19", A) is not None
    _put(store, "b2", B)
    assert all(store.get(f"b{i}", B) is not None for i in range(3)) and len(store) == 6


def test_the_byte_count_is_what_the_store_holds() -> None:
    store = ResponseStore(max_count=10, max_bytes=1 << 20, ttl=60)
    _put(store, "r", A, "y" * 1000)
    held = store._entries["r"].data
    assert isinstance(held, bytes) and store.bytes == len(held) == store.owned_bytes(A)


def test_zero_count_stores_nothing() -> None:
    store = ResponseStore(max_count=0, max_bytes=1 << 20, ttl=60)
    assert not _put(store, "r") and len(store) == 0


def test_the_server_flags_bound_the_apps_store() -> None:
    from runtime.contracts.config import ServerConfig
    from tokenizer.http_server import create_app
    from tokenizer.openai.responses.api import STORE
    from tokenizer.server_state import ServerState

    config = ServerConfig(responses_store_max_count=3, responses_store_max_bytes=4096, responses_store_ttl=5.0)
    store = create_app(ServerState(config))[STORE]
    assert (store.max_count, store.max_bytes, store.ttl) == (3, 4096, 5.0)
    with pytest.raises(InvalidRequest) as error:
        ServerConfig(responses_store_ttl=0)
    assert error.value.param == "responses_store_ttl"
