"""TokenizerManager through all three processes: the fake scheduler, the real detokenizer
process and the default model's tokenizer, driven by the Engine (one runtime for the module).

The fake scheduler "generates" the prompt ids in reverse order, one token per step, so every
expected text is `decode(reversed(prompt)[:max_new_tokens])`.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Coroutine, Iterator
from typing import Any

import pytest

from runtime.contracts.config import ServerConfig
from runtime.contracts.errors import InvalidRequest
from tests.tokenizer.fake_scheduler import run_fake_scheduler
from tokenizer.core.pipeline import generate
from tokenizer.engine import Engine
from tokenizer.native.generate import parse_generate

CONTEXT = 256
WAIT_S = 15.0


@pytest.fixture(scope="module")
def engine(default_model_path: str) -> Iterator[Engine]:
    config = ServerConfig(model_path=default_model_path, context_length=CONTEXT, max_n=4)
    eng = Engine.from_config(config, scheduler_target=run_fake_scheduler)
    yield eng
    eng.shutdown()


def _run(engine: Engine, coro: Coroutine[Any, Any, Any], timeout: float = WAIT_S) -> Any:
    return asyncio.run_coroutine_threadsafe(coro, engine.loop).result(timeout)


def _expected(engine: Engine, prompt_ids: list[int], n: int) -> str:
    rev = prompt_ids[::-1]
    ids = [rev[i % len(rev)] for i in range(n)]
    return engine.tokenizer_manager.tokenizer.decode(ids)


def _received(engine: Engine) -> list[list[str]]:
    return engine.get_state()["received"]


def _internal_rid(engine: Engine, label: str) -> str | None:
    """The server-made rid of the live request the client named `label` (None when none)."""
    states = list(engine.tokenizer_manager.rid_to_state.values())
    return next((s.rid for s in states if s.label == label), None)


def _wait_for(cond: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def test_round_trip(engine: Engine) -> None:
    prompt = "The quick brown fox jumps"
    ids = engine.tokenizer_manager.tokenizer.encode(prompt)
    out = engine.generate(prompt, {"max_new_tokens": 4}, rid="rt")
    assert out["text"] == _expected(engine, ids, 4)
    assert out["output_ids"] == ids[::-1][:4]
    meta = out["meta_info"]
    assert meta["id"] == "rt" and meta["finish_reason"] == {"type": "length", "length": 4}
    assert meta["prompt_tokens"] == len(ids) and meta["completion_tokens"] == 4
    assert meta["cached_tokens"] == 0
    assert meta["e2e_latency"] > 0 and "output_token_logprobs" not in meta


def test_streaming_is_cumulative(engine: Engine) -> None:
    ids = engine.tokenizer_manager.tokenizer.encode("alpha beta gamma delta")
    chunks = list(engine.generate(input_ids=ids, sampling_params={"max_new_tokens": 6},
                                  stream=True))
    assert len(chunks) >= 2
    for prev, cur in zip(chunks, chunks[1:]):
        assert cur["text"].startswith(prev["text"])
        assert cur["output_ids"][: len(prev["output_ids"])] == prev["output_ids"]
    assert all(c["meta_info"]["finish_reason"] is None for c in chunks[:-1])
    final = chunks[-1]
    assert final["meta_info"]["finish_reason"] == {"type": "length", "length": 6}
    assert final["text"] == _expected(engine, ids, 6) and len(final["output_ids"]) == 6


def test_batch_and_parallel_sampling_with_warmup(engine: Engine) -> None:
    outs = engine.generate(["one two", "three four five"], {"max_new_tokens": 2}, rid="b")
    assert [o["meta_info"]["id"] for o in outs] == ["b_0", "b_1"]
    tok = engine.tokenizer_manager.tokenizer
    assert [o["text"] for o in outs] == [_expected(engine, tok.encode(p), 2)
                                         for p in ("one two", "three four five")]
    outs = engine.generate("six seven", {"max_new_tokens": 3, "n": 3}, rid="par")
    assert [o["meta_info"]["id"] for o in outs] == ["par_0", "par_1", "par_2"]
    assert len({o["text"] for o in outs}) == 1
    # The scheduler sees server-made rids only, the warm-up first, then the samples
    got = [rid for kind, rid in _received(engine) if kind == "GenerateReq"][-4:]
    base = got[0].removesuffix("_warmup")
    assert got == [f"{base}_warmup", f"{base}_0", f"{base}_1", f"{base}_2"]
    assert not any("par" in rid or "b_" in rid for kind, rid in _received(engine))


def test_seeded_parallel_samples_get_distinct_seeds(engine: Engine) -> None:
    engine.generate("seeds", {"max_new_tokens": 1, "n": 3, "seed": 41}, rid="sd")
    seeds = engine.get_state()["seeds"]
    assert list(seeds.values())[-3:] == [41, 42, 43]


def test_apply_chat_template(engine: Engine) -> None:
    async def render() -> str:
        return engine.tokenizer_manager.apply_chat_template([{"role": "user", "content": "Hi!"}])

    text = _run(engine, render())
    assert isinstance(text, str) and "Hi!" in text and text.rstrip().endswith("assistant")


def test_streamed_batch_chunks_carry_index(engine: Engine) -> None:
    chunks = list(engine.generate(["a b c", "d e f g"], {"max_new_tokens": 3}, stream=True))
    finals = {c["index"]: c for c in chunks if c["meta_info"]["finish_reason"] is not None}
    assert sorted(finals) == [0, 1] and all(len(c["output_ids"]) == 3 for c in finals.values())


def test_logprobs_and_stop_token(engine: Engine) -> None:
    ids = [100, 200, 300, 400]
    params = {"max_new_tokens": 9, "stop_token_ids": [200]}
    out = engine.generate(input_ids=ids, sampling_params=params,
                          return_logprob=True, logprob_start_len=0, top_logprobs_num=2,
                          return_text_in_logprobs=True)
    meta = out["meta_info"]
    assert out["output_ids"] == [400, 300, 200]
    assert meta["finish_reason"] == {"type": "stop", "matched": 200}
    # The stop token is not decoded into the text.
    assert out["text"] == engine.tokenizer_manager.tokenizer.decode([400, 300])
    assert [e[:2] for e in meta["input_token_logprobs"]] == [
        [None, 100], [-1.0, 200], [-1.0, 300], [-1.0, 400]]
    assert all(isinstance(e[2], str) for e in meta["output_token_logprobs"])
    assert meta["input_top_logprobs"][0] is None and len(meta["input_top_logprobs"][1]) == 2
    assert [len(t) for t in meta["output_top_logprobs"]] == [2, 2, 2]


def test_prefill_only_request(engine: Engine) -> None:
    out = engine.generate(input_ids=[5, 6, 7], sampling_params={"max_new_tokens": 0},
                          return_logprob=True, logprob_start_len=1)
    assert out["text"] == "" and out["output_ids"] == []
    assert out["meta_info"]["finish_reason"] == {"type": "length", "length": 0}
    assert out["meta_info"]["input_token_logprobs"] == [[-1.0, 6, None], [-1.0, 7, None]]


def test_abort_running_request(engine: Engine) -> None:
    result: dict[str, Any] = {}
    worker = threading.Thread(target=lambda: result.update(
        engine.generate(input_ids=[1, 2, 3], sampling_params={"max_new_tokens": 200}, rid="long")))
    worker.start()
    _wait_for(lambda: _internal_rid(engine, "long") in engine.get_state()["running"], "the request to run")
    engine.abort("long")
    worker.join(WAIT_S)
    assert result["meta_info"]["finish_reason"]["type"] == "abort"
    assert 0 < len(result["output_ids"]) < 200


def test_cancelled_consumer_sends_abort(engine: Engine) -> None:
    tm = engine.tokenizer_manager
    started = threading.Event()

    async def consume() -> None:
        async for _ in await generate(tm, parse_generate({"input_ids": [9, 8, 7], "rid": "cancel-me", "stream": True,
                                                          "sampling_params": {"max_new_tokens": 200}})):
            started.set()

    future = asyncio.run_coroutine_threadsafe(consume(), engine.loop)
    assert started.wait(WAIT_S)
    rid = _internal_rid(engine, "cancel-me")
    assert rid is not None and rid != "cancel-me"
    future.cancel()
    _wait_for(lambda: ["AbortReq", rid] in _received(engine), "the AbortReq")
    _wait_for(lambda: rid not in engine.get_state()["running"], "the abort")
    assert rid not in tm.rid_to_state and _internal_rid(engine, "cancel-me") is None
    tm_integrity = asyncio.run_coroutine_threadsafe(_check(tm), engine.loop)
    tm_integrity.result(WAIT_S)


def test_breaking_out_of_a_stream_aborts(engine: Engine) -> None:
    rid = None
    for chunk in engine.generate(input_ids=[4, 5, 6], sampling_params={"max_new_tokens": 200},
                                 rid="brk", stream=True):
        assert chunk["meta_info"]["finish_reason"] is None
        rid = _internal_rid(engine, "brk")
        break
    _wait_for(lambda: ["AbortReq", rid] in _received(engine), "the AbortReq")
    assert rid not in engine.tokenizer_manager.rid_to_state


async def _check(tm: Any) -> None:
    tm.check_integrity()


def test_flush_cache_and_server_info(engine: Engine) -> None:
    assert engine.flush_cache() is True
    info = engine.get_server_info()
    assert info["vocab_size"] == 49152 and info["context_length"] == CONTEXT
    assert "api_key" not in info and info["internal_states"][0]["running"] == []


@pytest.mark.parametrize("kwargs, param", [
    ({"prompt": "ok", "sampling_params": {"temperature": -1}}, "sampling_params.temperature"),
    ({"prompt": "ok", "sampling_params": {"bogus": 1}}, "sampling_params.bogus"),
    ({"input_ids": [1, 49152]}, "input_ids"),
    ({"input_ids": [[1, 2], [3, 10**6]]}, "input_ids"),
    ({"prompt": "hello " * 300}, "text"),
    ({"input_ids": [1] * 200, "sampling_params": {"max_new_tokens": 100}}, "sampling_params.max_new_tokens"),
    ({"prompt": "ok", "sampling_params": {"n": 5}}, "sampling_params.n"),
    ({"prompt": "ok", "return_logprob": True, "top_logprobs_num": 50}, "top_logprobs_num"),
    ({"input_ids": [1, 2], "logprob_start_len": 2}, "logprob_start_len"),
    ({"prompt": ["fine", "also fine"], "sampling_params": [{}, {"top_p": 0}]}, "sampling_params[1].top_p"),
    ({"prompt": "ok", "priority": 3}, "priority"),  # without --enable-priority-scheduling
])
def test_invalid_requests_raise_and_send_nothing(
    engine: Engine, kwargs: dict[str, Any], param: str
) -> None:
    before = len(_received(engine))
    with pytest.raises(InvalidRequest) as info:
        engine.generate(**kwargs)
    assert info.value.param == param, info.value.message
    assert len(_received(engine)) == before + 1  # only our own GetStateReq arrived


def test_rid_in_use_is_rejected(engine: Engine) -> None:
    it = engine.generate(input_ids=[1, 2], sampling_params={"max_new_tokens": 200}, rid="dup",
                         stream=True)
    next(it)
    with pytest.raises(InvalidRequest) as info:
        engine.generate(input_ids=[1, 2], rid="dup")
    assert info.value.param == "rid"
    it.close()  # type: ignore[attr-defined]


# ---------------------------------------------------------------- client rids are labels


def test_a_live_rid_is_refused_and_free_again_once_its_client_left(engine: Engine) -> None:
    """The crash of issue 18: stream rid "d", read one chunk, leave; send rid "d" again at once
    (its abort may still be on the way). The scheduler and detokenizer only see server rids."""
    tm = engine.tokenizer_manager
    stream = engine.generate(input_ids=[11, 12, 13], sampling_params={"max_new_tokens": 200}, rid="d", stream=True)
    next(iter(stream))
    first = _internal_rid(engine, "d")
    with pytest.raises(InvalidRequest) as err:
        engine.generate(input_ids=[1, 2], sampling_params={"max_new_tokens": 2}, rid="d")
    assert err.value.param == "rid"
    stream.close()  # the client leaves: its request is aborted
    out = engine.generate(input_ids=[21, 22, 23], sampling_params={"max_new_tokens": 3}, rid="d")
    assert out["meta_info"]["id"] == "d" and out["meta_info"]["finish_reason"]["type"] == "length"
    assert out["text"] == _expected(engine, [21, 22, 23], 3)
    sent = [rid for kind, rid in _received(engine) if kind == "GenerateReq"]
    assert first in sent and "d" not in sent and len(set(sent)) == len(sent)
    _run(engine, _check(tm))


def test_aborting_v_leaves_another_clients_v_3_running(engine: Engine) -> None:
    results: dict[str, Any] = {}

    def run(rid: str) -> None:
        results[rid] = engine.generate(input_ids=[3, 4, 5], sampling_params={"max_new_tokens": 200}, rid=rid)

    workers = [threading.Thread(target=run, args=(rid,)) for rid in ("v", "v_3")]
    for worker in workers:
        worker.start()
    running = engine.get_state
    _wait_for(lambda: {_internal_rid(engine, r) for r in ("v", "v_3")} <= set(running()["running"]), "both to run")
    engine.abort("v")
    workers[0].join(WAIT_S)
    assert results["v"]["meta_info"]["finish_reason"]["type"] == "abort"
    assert "v_3" not in results and _internal_rid(engine, "v_3") in running()["running"]
    engine.abort("v_3")
    workers[1].join(WAIT_S)
    assert results["v_3"]["meta_info"]["finish_reason"]["type"] == "abort"


def test_a_batch_rid_aborts_every_prompt_of_the_batch(engine: Engine) -> None:
    results: list[Any] = []
    worker = threading.Thread(target=lambda: results.append(engine.generate(
        input_ids=[[1, 2], [3, 4]], sampling_params={"max_new_tokens": 200}, rid="bt")))
    worker.start()
    _wait_for(lambda: _internal_rid(engine, "bt_1") in engine.get_state()["running"], "the batch to run")
    engine.abort("bt")
    worker.join(WAIT_S)
    assert [o["meta_info"]["finish_reason"]["type"] for o in results[0]] == ["abort", "abort"]


def test_concurrent_grammar_checks_cannot_pass_the_queue_cap(engine: Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    """Admission counts a request from the moment it is admitted: 6 requests whose grammar
    checks are all in progress at once, against room for 3: 3 are admitted, 3 get 503."""
    import tokenizer.manager as manager_module
    from runtime.contracts.errors import Overloaded

    tm = engine.tokenizer_manager
    gate, entered = asyncio.Event(), []

    async def slow_check(params: Any) -> None:
        entered.append(params)
        await gate.wait()

    async def scenario() -> list[Any]:
        monkeypatch.setattr(manager_module, "check_grammar", slow_check)
        saved, tm.max_live = tm.max_live, len(tm.rid_to_state) + 3

        async def one(i: int) -> Any:
            try:
                return [out async for out in await generate(tm, parse_generate(
                    {"input_ids": [7, 8], "sampling_params": {"max_new_tokens": 1}}))][-1]
            except Overloaded as exc:
                return exc

        try:
            tasks = [asyncio.ensure_future(one(i)) for i in range(6)]
            deadline = time.monotonic() + WAIT_S
            while len(entered) + sum(t.done() for t in tasks) < 6:  # each admitted or refused
                assert time.monotonic() < deadline, (len(entered), [t.done() for t in tasks])
                await asyncio.sleep(0.01)
            gate.set()
            return await asyncio.gather(*tasks)
        finally:
            tm.max_live = saved

    outs = _run(engine, scenario())
    assert sum(isinstance(o, Overloaded) for o in outs) == 3, outs
    assert all(o.finished.reason == "length" for o in outs if not isinstance(o, Overloaded))
    assert tm._reserved == 0
    _run(engine, _check(tm))
