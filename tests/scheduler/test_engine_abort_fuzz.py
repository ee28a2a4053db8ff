"""Abort fuzz through the whole runtime (Engine, three processes) on a tiny model.

Concurrent requests end in every way a client can end them: normally, by `abort(rid)`, by leaving
a stream early (the disconnect path: the TokenizerManager aborts what it no longer reads), and by
`abort_all`, with the overlap loop on and off. Every call ends exactly once, and once the engine
is idle no KV slot or request row is held.
"""

from __future__ import annotations

import random
import threading
import time

import pytest

from runtime import Engine
from tests.engine_checks import assert_idle_and_sound

pytestmark = pytest.mark.slow


def _client(engine: Engine, i: int, rng: random.Random, outcomes: dict[str, str],
            timers: list[threading.Timer]) -> None:
    rid = f"fuzz{i}"
    prompt = [rng.randrange(3, 300) for _ in range(rng.randrange(1, 80))]
    params = {"max_new_tokens": rng.randrange(1, 60), "ignore_eos": True, "temperature": 0}
    mode = rng.choice(["plain", "abort", "disconnect"])
    if mode == "disconnect":
        stream = engine.generate(input_ids=prompt, sampling_params=params, stream=True, rid=rid)
        for n, _ in enumerate(stream):
            if n >= rng.randrange(0, 4):
                break
        stream.close()  # type: ignore[attr-defined]
        outcomes[rid] = "disconnected"
        return
    if mode == "abort":
        timer = threading.Timer(rng.random() * 0.3, engine.abort, args=(rid,))
        timers.append(timer)
        timer.start()
    result = engine.generate(input_ids=prompt, sampling_params=params, rid=rid)
    outcomes[rid] = result["meta_info"]["finish_reason"]["type"]


@pytest.mark.parametrize("overlap", [False, True])
def test_abort_fuzz_through_the_engine(tiny_model: str, overlap: bool) -> None:
    rng = random.Random(11)
    outcomes: dict[str, str] = {}
    timers: list[threading.Timer] = []
    with Engine(tiny_model, dtype="float32", max_total_tokens=600, chunked_prefill_size=32,
                max_running_requests=8, disable_overlap_schedule=not overlap) as engine:
        threads = [threading.Thread(target=_client, args=(engine, i, random.Random(rng.random()), outcomes, timers))
                   for i in range(40)]
        for t in threads:
            t.start()
            time.sleep(rng.random() * 0.02)
        time.sleep(0.2)
        engine.abort_all()
        for t in threads:
            t.join(timeout=60)
            assert not t.is_alive(), "a client never got an answer"
        for timer in timers:  # an abort of a finished request is a no-op, but it must not outlive us
            timer.join(timeout=5)
        assert len(outcomes) == 40
        assert set(outcomes.values()) <= {"length", "abort", "disconnected"}
        assert_idle_and_sound(engine)
