"""The scheduler driven in-process (no sockets) on a tiny random-weight Llama.

Greedy outputs must equal the static-batch runner's for every scheduling configuration, and the
memory invariant must hold whenever the scheduler goes idle (it checks itself and raises).
"""

from __future__ import annotations

import math
import random

import pytest
import torch
import transformers

from runtime.contracts.messages import AbortReq, FlushCacheReq, GetStateReq
from runtime.execution import input_logprobs
from runtime.execution.static_batch import StaticBatch
from tests.scheduler.harness import VOCAB, collect, make, run_until_idle, submit


def workload(seed: int = 0, n: int = 12) -> list[list[int]]:
    rng = random.Random(seed)
    shared = [rng.randrange(3, VOCAB) for _ in range(24)]
    prompts = []
    for i in range(n):
        own = [rng.randrange(3, VOCAB) for _ in range(rng.randrange(1, 40))]
        prompts.append(shared[: rng.randrange(0, 24)] + own if i % 2 else own)
    return prompts


@pytest.fixture(scope="module")
def reference(tiny_model: str) -> list[list[int]]:
    engine = StaticBatch.create(tiny_model, dtype="float32", max_total_tokens=4096, max_running_requests=16)
    return [engine.generate_greedy([p], 6)[0] for p in workload()]


CONFIGS = [
    dict(),
    dict(disable_overlap_schedule=False),
    dict(disable_overlap_schedule=False, chunked_prefill_size=8, page_size=4),
    dict(disable_overlap_schedule=False, max_total_tokens=96, chunked_prefill_size=16),
    dict(chunked_prefill_size=8),
    dict(chunked_prefill_size=8, disable_radix_cache=True),
    dict(disable_radix_cache=True),
    dict(max_total_tokens=96, chunked_prefill_size=16),  # tight pool: admission waits, eviction
    dict(page_size=4, chunked_prefill_size=8),
    dict(schedule_policy="lpm", max_running_requests=3),
    dict(schedule_policy="dfs-weight", chunked_prefill_size=8),
]


@pytest.mark.parametrize("overrides", CONFIGS, ids=[str(c) for c in CONFIGS])
def test_greedy_outputs_match_static_batch(tiny_model: str, reference: list[list[int]], overrides) -> None:
    sched, io = make(tiny_model, **overrides)
    for i, prompt in enumerate(workload()):
        submit(io, f"r{i}", prompt, max_new_tokens=6)
    results = run_until_idle(sched, io)
    for i, expected in enumerate(reference):
        r = results[f"r{i}"]
        assert r["ids"] == expected, f"r{i}"
        assert r["finishes"] == 1 and r["finish"] == {"type": "length", "length": 6}


def test_repeat_prompt_hits_cache(tiny_model: str) -> None:
    sched, io = make(tiny_model)
    prompt = workload()[1] + list(range(10, 40))
    submit(io, "a", prompt, max_new_tokens=5)
    first = run_until_idle(sched, io)["a"]
    submit(io, "b", prompt, max_new_tokens=5)
    second = run_until_idle(sched, io)["b"]
    assert first["cached"] == 0 and second["cached"] == len(prompt) - 1
    assert first["ids"] == second["ids"]


def test_abort_waiting_running_and_chunked(tiny_model: str) -> None:
    sched, io = make(tiny_model, chunked_prefill_size=8, max_running_requests=2)
    submit(io, "run", [5] * 10, max_new_tokens=200)
    submit(io, "chunk", list(range(3, 60)), max_new_tokens=200)
    submit(io, "wait", [7] * 5, max_new_tokens=200)
    for _ in range(3):
        sched.step()
    assert sched.queues.chunked is not None and sched.queues.chunked.rid == "chunk"
    io.inbox += [AbortReq("run"), AbortReq("chunk"), AbortReq("wait")]
    results = run_until_idle(sched, io)
    for rid in ("run", "chunk", "wait"):
        assert results[rid]["finish"]["type"] == "abort" and results[rid]["finishes"] == 1, rid


def test_abort_all_and_n_children_by_prefix(tiny_model: str) -> None:
    sched, io = make(tiny_model)
    for rid in ("p_0", "p_1", "p10", "q"):
        submit(io, rid, [9, 8, 7], max_new_tokens=100)
    sched.step()
    io.inbox.append(AbortReq("p"))
    sched.step()
    results = collect(io)
    assert {rid for rid, r in results.items() if r["finish"]} == {"p_0", "p_1"}
    io.inbox.append(AbortReq(abort_all=True))
    results = run_until_idle(sched, io)
    assert results["p10"]["finish"]["type"] == "abort" and results["q"]["finish"]["type"] == "abort"


def test_stop_token_and_eos(tiny_model: str, reference: list[list[int]]) -> None:
    sched, io = make(tiny_model)
    expected = reference[0]
    submit(io, "s", workload()[0], max_new_tokens=6, stop_token_ids=[expected[2]])
    results = run_until_idle(sched, io)
    stop_at = expected.index(expected[2])
    assert results["s"]["ids"] == expected[: stop_at + 1]
    assert results["s"]["finish"] == {"type": "stop", "matched": expected[2]}


@pytest.mark.parametrize("slice_rows", [256, 3], ids=["one-slice", "slices-of-3"])
def test_prefill_only_input_logprobs_match_hf(tiny_model: str, slice_rows: int, monkeypatch) -> None:
    """(Scored in slices of INPUT_LOGPROB_ROWS prompt rows per lm_head call: the same numbers.)"""
    monkeypatch.setattr(input_logprobs, "INPUT_LOGPROB_ROWS", slice_rows)
    prompt = workload()[3]
    sched, io = make(tiny_model, chunked_prefill_size=8)
    submit(io, "score", prompt, max_new_tokens=0, return_logprob=True, logprob_start_len=0)
    r = run_until_idle(sched, io)["score"]
    assert r["ids"] == [] and r["finish"] == {"type": "length", "length": 0}
    hf = transformers.AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32)
    with torch.no_grad():
        logp = torch.log_softmax(hf(torch.tensor([prompt])).logits[0].float(), -1)
    expected = [None] + [logp[i, prompt[i + 1]].item() for i in range(len(prompt) - 1)]
    assert r["input_logprobs"][0] is None and len(r["input_logprobs"]) == len(prompt)
    for got, want in zip(r["input_logprobs"][1:], expected[1:]):
        assert math.isclose(got, want, abs_tol=1e-4)


def test_rejects_oversized_and_keeps_serving(tiny_model: str) -> None:
    sched, io = make(tiny_model, max_total_tokens=64)
    submit(io, "huge", list(range(3, 100)), max_new_tokens=4)
    submit(io, "ok", [4, 5, 6], max_new_tokens=4)
    results = run_until_idle(sched, io)
    assert results["huge"]["finish"]["type"] == "abort" and "KV" in results["huge"]["finish"]["message"]
    assert results["ok"]["finish"]["type"] == "length"


def test_a_second_request_with_a_live_rid_fails_that_rid_alone(tiny_model: str) -> None:
    """The main process makes every rid, so this is a bug there; the scheduler still only fails
    the request that holds the rid, exactly once, and keeps serving the rest."""
    sched, io = make(tiny_model)
    submit(io, "dup", [4, 5, 6], max_new_tokens=50)
    submit(io, "other", [7, 8, 9], max_new_tokens=6)
    sched.step()
    submit(io, "dup", [1, 2, 3], max_new_tokens=4)
    results = run_until_idle(sched, io)
    assert results["dup"]["finish"]["type"] == "abort" and results["dup"]["finishes"] == 1
    assert results["other"]["finish"]["type"] == "length" and len(results["other"]["ids"]) == 6


def test_flush_and_state(tiny_model: str) -> None:
    sched, io = make(tiny_model)
    submit(io, "a", [4, 5, 6, 7], max_new_tokens=3)
    run_until_idle(sched, io)
    io.inbox += [GetStateReq(1), FlushCacheReq(2), GetStateReq(3)]
    sched.step()
    before, flushed, after = io.control
    assert before.state["integrity"] == "ok" and before.state["kv_evictable"] > 0
    assert flushed.success and after.state["kv_evictable"] == 0


@pytest.mark.parametrize("overlap", [False, True])
def test_abort_while_batch_in_flight_reports_once(tiny_model: str, overlap: bool) -> None:
    sched, io = make(tiny_model, disable_overlap_schedule=not overlap)
    for i in range(4):
        submit(io, f"x{i}", [11 + i] * (3 + i), max_new_tokens=40)
    for step in range(200):
        if step == 5:
            io.inbox += [AbortReq("x1"), AbortReq("x3")]
        sched.step()
        if sched.is_idle and sched.in_flight is None and step > 5:
            break
    sched.check_idle_integrity()
    results = collect(io)
    assert all(r["finishes"] == 1 for r in results.values()), results
    assert results["x1"]["finish"]["type"] == "abort" and results["x0"]["finish"]["type"] == "length"


@pytest.mark.parametrize("overlap", [False, True])
def test_retraction_keeps_outputs_identical(tiny_model: str, overlap: bool) -> None:
    """A pool that admits optimistically must retract; outputs still equal the static batch."""
    prompts = [[20 + i] * (6 + i) for i in range(8)]
    engine = StaticBatch.create(tiny_model, dtype="float32", max_total_tokens=4096, max_running_requests=8)
    expected = [engine.generate_greedy([p], 40)[0] for p in prompts]
    sched, io = make(tiny_model, max_total_tokens=160, chunked_prefill_size=16,
                     disable_overlap_schedule=not overlap)
    for i, p in enumerate(prompts):
        submit(io, f"t{i}", p, max_new_tokens=40)
    results = run_until_idle(sched, io)
    assert sched.retractor.retractions > 0
    for i in range(len(prompts)):
        assert results[f"t{i}"]["ids"] == expected[i] and results[f"t{i}"]["finishes"] == 1


def test_abort_of_a_prefill_in_flight_under_overlap(tiny_model: str) -> None:
    """Aborted while its prefill runs on the forward thread: it is in no queue, but holds a row."""
    sched, io = make(tiny_model, disable_overlap_schedule=False)
    submit(io, "inflight", [5, 6, 7, 8], max_new_tokens=50)
    sched.step()
    assert sched.in_flight is not None and sched.in_flight.is_prefill
    io.inbox.append(AbortReq("inflight"))
    sched.step()
    assert sched.in_flight is None
    results = run_until_idle(sched, io)
    assert results["inflight"]["finish"]["type"] == "abort" and results["inflight"]["finishes"] == 1


def test_flush_refused_while_a_prefill_is_in_flight(tiny_model: str) -> None:
    sched, io = make(tiny_model, disable_overlap_schedule=False)
    submit(io, "a", [5, 6, 7, 8], max_new_tokens=3)
    sched.step()
    assert sched.in_flight is not None and not sched.is_idle
    io.inbox.append(FlushCacheReq(7))
    sched.step()
    assert io.control[-1].req_id == 7 and not io.control[-1].success
    while sched.in_flight is not None or not sched.is_idle:
        sched.step()
    assert collect(io)["a"]["finishes"] == 1
    sched.check_idle_integrity()


def _sends(io, rid: str) -> list[int]:
    """New-token counts of every message that carried `rid`."""
    return [len(out.new_ids[out.rids.index(rid)]) for out in io.outs if rid in out.rids]


@pytest.mark.parametrize("server_interval,own_interval", [(4, None), (1, 4)])
def test_stream_interval_batches_tokens(tiny_model: str, server_interval: int, own_interval: int | None) -> None:
    """The first token goes at once, then every `stream_interval` tokens, the finish at once;
    a request's own stream_interval overrides the server's; a request nobody streams sends its
    first token and then only at the finish (or every NONSTREAM_INTERVAL tokens)."""
    sched, io = make(tiny_model, stream_interval=server_interval)
    submit(io, "s", [5, 6, 7], max_new_tokens=10, stream=True, stream_interval=own_interval)
    submit(io, "plain", [5, 6, 8], max_new_tokens=10)
    for _ in range(200):
        sched.step()
        if sched.is_idle:
            break
    assert _sends(io, "s") == [1, 4, 4, 1]
    assert _sends(io, "plain") == [1, 9]
    results = collect(io)
    assert len(results["s"]["ids"]) == len(results["plain"]["ids"]) == 10


def test_nonstreamed_long_output_is_sent_every_50_tokens(tiny_model: str) -> None:
    from scheduler.output import NONSTREAM_INTERVAL

    sched, io = make(tiny_model)
    submit(io, "long", [5, 6, 7], max_new_tokens=120)
    while True:
        sched.step()
        if sched.is_idle:
            break
    assert _sends(io, "long") == [1, NONSTREAM_INTERVAL, NONSTREAM_INTERVAL, 120 - 1 - 2 * NONSTREAM_INTERVAL]


def test_stop_strings_travel_in_the_first_message_only(tiny_model: str) -> None:
    """The detokenizer keeps a request's options from its first message; later ones omit them."""
    sched, io = make(tiny_model)
    submit(io, "s", [5, 6, 7], max_new_tokens=4, stop=["never appears"], stream=True)
    for _ in range(10):
        sched.step()
    stops = [out.stop_strs[out.rids.index("s")] for out in io.outs if "s" in out.rids]
    assert len(stops) >= 2 and stops[0] == ["never appears"] and all(s == [] for s in stops[1:])
