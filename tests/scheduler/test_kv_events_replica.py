"""A subscriber to --kv-events rebuilds exactly the blocks the scheduler's pool holds, through a
workload with evictions (a pool smaller than the sessions), a flush, and more work after it."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import zmq

from radix.blocks import event_id
from radix.prefix_cache import RadixPrefixCache
from runtime.contracts.ipc import IpcDir
from runtime.contracts.messages import FlushCacheReq
from tests.scheduler.harness import make
from tests.scheduler.test_kv_events import Subscriber
from tests.scheduler.test_kv_tier import SMALL_POOL, TURNS, run_sessions

pytestmark = pytest.mark.slow


@pytest.fixture
def ctx() -> Iterator[zmq.Context[Any]]:
    context: zmq.Context[Any] = zmq.Context()
    yield context
    context.destroy(linger=0)


def pool_blocks(sched: Any) -> set[int]:
    cache = sched.ledger.cache
    assert isinstance(cache, RadixPrefixCache)
    return {event_id(h) for node in cache.tree._nodes() for h in node.hashes}


def test_subscriber_rebuilds_the_pool(default_model_path: str, ctx: zmq.Context[Any]) -> None:
    with IpcDir() as ipc:
        endpoint = ipc.endpoint("kv-events")
        sched, io = make(default_model_path, max_total_tokens=SMALL_POOL, kv_events=endpoint, kv_block_size=16)
        try:
            events = sched.events
            assert events is not None
            sub = Subscriber(ctx, endpoint)
            sub.join(events)
            histories: dict[int, list[int]] = {}
            run_sessions(sched, io, range(TURNS - 1), histories)
            assert sched.state()["evicted_tokens"] > 0
            sub.catch_up(events)
            assert sub.blocks == pool_blocks(sched) and sub.blocks
            sched.dispatch(FlushCacheReq(1))
            sched.step()  # an iteration publishes what the flush did
            sub.catch_up(events)
            assert sub.blocks == pool_blocks(sched) == set()
            run_sessions(sched, io, range(TURNS - 1, TURNS), histories)
            sub.catch_up(events)
            assert sub.blocks == pool_blocks(sched) and sub.blocks
        finally:
            sched.close()
