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
from typing import Any

import pytest

from runtime import Engine
from tests.engine_checks import assert_idle_and_sound

pytestmark = pytest.mark.slow


# An aborted request asks for many tokens. When the abort is sent, the TokenizerManager (a few
# steps behind the scheduler at most) has received `seen` of them; with seen < DECISIVE the
# request cannot have finished on its own, so it must end as an abort, on any CPU.
UNFINISHABLE = 400
DECISIVE = UNFINISHABLE // 2


async def _abort_live(manager: Any, rid: str) -> int | None:
    """Abort `rid` on the engine's loop; the tokens its manager state had received, None when
    it was no longer live there."""
    live = [manager.rid_to_state[internal] for internal in manager.labels.find(rid)]  # rid is a label
    state = live[0] if live else None
    seen = None if state is None or state.finished else state.completion_tokens
    await manager.abort(rid)
    return seen


def _abort(engine: Engine, rid: str) -> str:
    seen = engine._call(_abort_live(engine.tokenizer_manager, rid))
    return "decisive" if seen is not None and seen < DECISIVE else "late"


def _client(engine: Engine, i: int, rng: random.Random, outcomes: dict[str, str], acted: threading.Event) -> None:
    """One client; sets `acted` once its own abort or disconnect is done (a plain one at once)."""
    try:
        _act(engine, f"fuzz{i}", rng, outcomes, acted)
    finally:
        acted.set()


def _act(engine: Engine, rid: str, rng: random.Random, outcomes: dict[str, str], acted: threading.Event) -> None:
    prompt = [rng.randrange(3, 300) for _ in range(rng.randrange(1, 80))]
    params = {"max_new_tokens": rng.randrange(1, 60), "ignore_eos": True, "temperature": 0}
    mode = rng.choice(["plain", "abort", "disconnect"])
    if mode == "plain":
        acted.set()
        result = engine.generate(input_ids=prompt, sampling_params=params, rid=rid)
        outcomes[rid] = "plain:" + result["meta_info"]["finish_reason"]["type"]
        return
    if mode == "abort":
        params["max_new_tokens"] = UNFINISHABLE
    stream = engine.generate(input_ids=prompt, sampling_params=params, stream=True, rid=rid)
    # Leave or abort before the first chunk (waiting, mid-prefill) or after a few (decoding).
    after = rng.randrange(0, 4)
    if mode == "disconnect":
        for n, _ in enumerate(stream):
            if n >= after:
                break
        stream.close()  # type: ignore[attr-defined]
        acted.set()
        outcomes[rid] = "disconnected"
        return
    kind = "late"
    if after == 0:
        kind = _abort(engine, rid)
        acted.set()
    last: dict = {}
    for n, chunk in enumerate(stream, start=1):
        if n == after:
            kind = _abort(engine, rid)
            acted.set()
        last = chunk
    outcomes[rid] = f"abort-{kind}:" + last["meta_info"]["finish_reason"]["type"]


@pytest.mark.parametrize("overlap", [False, True])
def test_abort_fuzz_through_the_engine(tiny_model: str, overlap: bool) -> None:
    rng = random.Random(11)
    outcomes: dict[str, str] = {}
    with Engine(tiny_model, dtype="float32", max_total_tokens=600, chunked_prefill_size=32,
                max_running_requests=8, disable_overlap_schedule=not overlap) as engine:
        acted = [threading.Event() for _ in range(40)]
        threads = [threading.Thread(target=_client, args=(engine, i, random.Random(rng.random()), outcomes, acted[i]))
                   for i in range(40)]
        for t in threads:
            t.start()
            time.sleep(rng.random() * 0.02)
        # abort_all comes once every client has made its own move, so on a loaded machine it
        # cannot end the requests whose own abort the test is about before they send it.
        for event in acted:
            assert event.wait(60), "a client never made its move"
        engine.abort_all()
        for t in threads:
            t.join(timeout=60)
            assert not t.is_alive(), "a client never got an answer"
        assert len(outcomes) == 40
        modes = {o.split(":")[0] for o in outcomes.values()}
        assert {"plain", "abort-decisive", "disconnected"} <= modes, outcomes
        decisive = [o for o in outcomes.values() if o.startswith("abort-decisive:")]
        assert decisive == ["abort-decisive:abort"] * len(decisive), outcomes  # every abort took effect
        assert {o for o in outcomes.values() if o.startswith("plain:")} <= {"plain:length", "plain:abort"}
        assert_idle_and_sound(engine)
