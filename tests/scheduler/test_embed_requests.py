"""Embed requests in the decoder's scheduler (fake runner): prefill only, the vector on the
finishing message, the prompt left in the radix cache, and inputs sharing a prefix computing it
once even when they arrive together."""

from __future__ import annotations

from runtime.contracts.messages import GenerateReq
from runtime.contracts.sampling import SamplingParams
from scheduler.admission import SHARED_PREFIX_TOKENS
from tests.scheduler.fake_runner import make_fake
from tests.scheduler.io_helpers import FakeIO

PREFIX = list(range(3, 3 + 3 * SHARED_PREFIX_TOKENS))


def _embed(io: FakeIO, rid: str, prompt: list[int]) -> None:
    io.inbox.append(GenerateReq(rid, prompt, SamplingParams(max_new_tokens=0), embed=True))


def _finished(io: FakeIO) -> dict[str, tuple[list[float] | None, int]]:
    return {rid: (vec, cached) for out in io.outs
            for rid, reason, vec, cached in zip(out.rids, out.finished_reasons, out.embeddings, out.cached_tokens)
            if reason is not None}


def _drive(io: FakeIO, sched: object, steps: int = 20) -> None:
    for _ in range(steps):
        sched.step()  # type: ignore[attr-defined]


def test_an_embed_request_returns_its_prompt_vector_and_no_tokens() -> None:
    sched, io, runner = make_fake()
    _embed(io, "a", [5, 6, 7])
    _drive(io, sched)
    (out,) = [o for o in io.outs if o.rids == ["a"]]
    assert out.embeddings == [[5.0, 6.0, 7.0]] and out.new_ids == [[]] and out.completion_tokens == [0]
    assert out.finished_reasons == [{"type": "length", "length": 0}]
    sched.check_integrity()


def test_inputs_arriving_together_share_their_prefix_through_the_cache() -> None:
    sched, io, runner = make_fake(tokens=2048)
    prompts = {f"d{i}": PREFIX + [100 + i, 200 + i] for i in range(4)}
    for rid, prompt in prompts.items():
        _embed(io, rid, prompt)
    _drive(io, sched)
    done = _finished(io)
    assert {rid: vec for rid, (vec, _) in done.items()} == {rid: [float(t) for t in p] for rid, p in prompts.items()}
    cached = sorted(c for _, c in done.values())
    assert cached[0] == 0 and cached[1:] == [len(PREFIX)] * 3  # the first computes it, the rest read it
    prefill_tokens = sum(len(e.input_ids) for batch in runner.log for e in batch)
    assert prefill_tokens == len(PREFIX) + 2 * 4


def test_generation_requests_are_not_held_back() -> None:
    sched, io, runner = make_fake(tokens=2048)
    for i in range(2):
        io.inbox.append(GenerateReq(f"g{i}", PREFIX + [100 + i], SamplingParams(max_new_tokens=1, temperature=0.0)))
    sched.step()
    assert len(runner.log[0]) == 2  # both prefilled in the first step, as before
