"""Assertions shared by the tests that drive a whole runtime through `runtime.Engine`."""

from __future__ import annotations

import time

from runtime import Engine


def assert_idle_and_sound(engine: Engine, timeout_s: float = 10.0) -> None:
    """Wait until the scheduler has nothing running or waiting, then check that no KV slot, lock
    or request row is held: available + evictable == total, nothing protected, all rows free."""
    deadline = time.monotonic() + timeout_s
    state = engine.get_state()
    while state["running"] or state["waiting"]:
        assert time.monotonic() < deadline, state
        time.sleep(0.05)
        state = engine.get_state()
    assert state["integrity"] == "ok", state
    held = state["kv_available"] + state["kv_evictable"] + state["kv_protected"]
    assert held == state["kv_total"] and state["kv_protected"] == 0, state
    assert state["rows_free"] == state["rows_total"], state
