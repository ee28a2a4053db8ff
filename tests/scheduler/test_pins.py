"""Pins (Anthropic cache_control): a pinned prefix outlives eviction pressure until its deadline,
the tokens a pin writes are reported, pins beyond the cap are refused, and while idle the only
protected tokens are the pinned ones."""

from __future__ import annotations

import random

import pytest

from runtime.contracts.messages import FlushCacheReq
from tests.scheduler.harness import make, run_until_idle, submit

pytestmark = pytest.mark.slow

POOL = 640
PINNED = list(range(1000, 1128))  # a 128-token "system prompt and tools"


def others(count: int, seed: int = 3) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(200, 40000) for _ in range(300)] for _ in range(count)]


def test_a_pin_keeps_its_prefix_through_eviction(default_model_path: str) -> None:
    sched, io = make(default_model_path, max_total_tokens=POOL)
    submit(io, "pin", PINNED + [5, 6, 7], max_new_tokens=2, pin_prefix_len=len(PINNED), pin_ttl_s=300.0)
    assert run_until_idle(sched, io)["pin"]["pinned"] == len(PINNED)
    assert sched.state()["pinned_tokens"] == len(PINNED)
    for i, prompt in enumerate(others(4)):  # each fills most of what the pin leaves of the pool
        submit(io, f"o{i}", prompt, max_new_tokens=2)
        run_until_idle(sched, io)
    assert sched.state()["evicted_tokens"] > 0
    submit(io, "again", PINNED + [8, 9], max_new_tokens=2, pin_prefix_len=len(PINNED), pin_ttl_s=300.0)
    again = run_until_idle(sched, io)["again"]
    assert again["cached"] == len(PINNED) and again["pinned"] == 0  # read from the cache, nothing written
    assert sched.state()["pins"] == 1  # the same prefix: its deadline moved, no second lock
    sched.ledger.pins.expire(float("inf"))
    assert sched.state()["pinned_tokens"] == 0 and sched.ledger.cache.protected_size == 0
    sched.check_idle_integrity()


def test_pins_beyond_the_cap_are_refused(default_model_path: str) -> None:
    sched, io = make(default_model_path, max_total_tokens=POOL, kv_pin_max_fraction=0.1)
    submit(io, "big", PINNED + [5], max_new_tokens=2, pin_prefix_len=len(PINNED), pin_ttl_s=300.0)
    assert run_until_idle(sched, io)["big"]["pinned"] == 0  # 128 tokens > a tenth of 640
    assert sched.state()["pins_refused"] == 1 and sched.state()["pinned_tokens"] == 0


def test_flush_drops_pins(default_model_path: str) -> None:
    sched, io = make(default_model_path, max_total_tokens=POOL)
    submit(io, "pin", PINNED + [5], max_new_tokens=2, pin_prefix_len=len(PINNED), pin_ttl_s=300.0)
    run_until_idle(sched, io)
    sched.dispatch(FlushCacheReq(1))
    assert io.control[-1].success
    assert sched.state()["pinned_tokens"] == 0 and sched.ledger.cache.evictable_size == 0
    sched.check_idle_integrity()
