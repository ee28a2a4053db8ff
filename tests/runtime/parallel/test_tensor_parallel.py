"""Tensor parallelism on CPU (one thread per rank; collectives through shared memory, and through
gloo alone) against one rank, on the default model in fp32: the logits after a prefill and 8
greedy decode steps agree within 1e-4 relative, and the ranks stay in step across batches of
two requests."""

from __future__ import annotations

import pytest
import torch

from runtime.contracts.config import ServerConfig
from runtime.contracts.sampling import SamplingParams
from runtime.execution.model_runner import ForwardEntry, ModelRunner
from runtime.execution.model_setup import load_model_for_serving
from runtime.execution.resolve import resolve_config
from tests.runtime.parallel.tp_harness import tp_runner

pytestmark = pytest.mark.slow

PROMPTS = [[1, 504, 3575, 282, 4649, 314], list(range(2000, 2040))]  # 6 and 40 tokens
DECODE_STEPS = 8
SLOTS_PER_ROW = 64  # row r writes KV slots 1 + r * 64 onward
GREEDY = SamplingParams(temperature=0.0)


def config(path: str, tp_size: int) -> ServerConfig:
    return resolve_config(ServerConfig(model_path=path, device="cpu", dtype="float32", tp_size=tp_size,
                                       max_total_tokens=1024, max_running_requests=4))


def greedy_logits(runner: ModelRunner) -> list[torch.Tensor]:
    """The logits [2, vocab] of a two-request prefill and of each decode step after it."""
    base = [1 + r * SLOTS_PER_ROW for r in range(len(PROMPTS))]
    entries = [ForwardEntry(row=r, input_ids=p, prefix_len=0, kv_write=list(range(base[r], base[r] + len(p))),
                            kv_write_start=0, sampling=GREEDY) for r, p in enumerate(PROMPTS)]
    out = runner.forward(entries, keep_logits=True)
    logits = [out.last_logits.clone()]
    lengths = [len(p) for p in PROMPTS]
    for _ in range(DECODE_STEPS):
        next_ids = out.host_next_ids()
        entries = [ForwardEntry(row=r, input_ids=[t], prefix_len=n, kv_write=[base[r] + n], kv_write_start=n,
                                sampling=GREEDY)
                   for r, (t, n) in enumerate(zip(next_ids, lengths))]
        out = runner.forward(entries, keep_logits=True)
        logits.append(out.last_logits.clone())
        lengths = [n + 1 for n in lengths]
    return logits


@pytest.fixture(scope="module")
def one_rank(default_model_path: str) -> list[torch.Tensor]:
    return greedy_logits(ModelRunner(load_model_for_serving(config(default_model_path, 1))))


@pytest.mark.parametrize("transport", ["shm", "gloo"])
def test_two_ranks_match_one(default_model_path: str, one_rank: list[torch.Tensor], transport: str,
                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RADIXSERVE_TP_SHM", "1" if transport == "shm" else "0")  # the follower inherits it
    with tp_runner(config(default_model_path, 2)) as runner:
        assert runner.tp is not None and runner.kv_pool.k[0].shape[1] == 2  # 3 KV heads: 2 + 1
        assert (runner.tp.group.shm is not None) == (transport == "shm")
        two_ranks = greedy_logits(runner)
    for step, (want, got) in enumerate(zip(one_rank, two_ranks)):
        scale = want.abs().max()
        rel = ((got - want).abs().max() / scale).item()
        assert rel < 1e-4, f"step {step}: relative error {rel:.2e}"
        assert torch.equal(got.argmax(-1), want.argmax(-1)), step
