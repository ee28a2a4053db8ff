"""The equivalence grid (tests/scheduler/test_equivalence.py's PAIRWISE rows) on sliding-window
models: greedy tokens must not depend on overlap, the radix cache, chunking, page size or mixed
batches, with prompts (and a shared cached prefix) longer than the window.

One tiny random-weight checkpoint per family, from transformers' own config classes: Mistral
v0.1 style (a window on every layer), Phi-3-mini-4k style (an odd window), Gemma 2 (alternating
layers, soft caps) and Gemma 3 (alternating layers, a local rope base). head_dim 64, so the C++
kernels run the windowed layers where the family allows them.
"""

from __future__ import annotations

import random
from typing import Any

import pytest

from tests import FULL_TESTS
from tests.scheduler.harness import VOCAB, make, run_until_idle, submit
from tests.scheduler.test_equivalence import BASELINE, PAIRWISE, Config

pytestmark = pytest.mark.slow

WINDOW = 8
SHARED = list(range(100, 124))  # a 24-token shared prefix: three windows long


def windowed_prompts() -> list[tuple[list[int], dict]]:
    rng = random.Random(7)
    out = []
    for i in range(8):
        own = [rng.randrange(3, VOCAB) for _ in range(rng.randrange(3, 60))]
        out.append((SHARED + own if i % 2 else own, {"max_new_tokens": 16}))
    return out


def _hf_model(family: str):  # type: ignore[no-untyped-def]
    import transformers

    common = dict(hidden_size=128, intermediate_size=128, num_hidden_layers=3, num_attention_heads=4,
                  num_key_value_heads=2, vocab_size=VOCAB, max_position_embeddings=512, eos_token_id=2,
                  tie_word_embeddings=False)
    gemma = dict(head_dim=64, query_pre_attn_scalar=64, sliding_window=WINDOW)
    if family == "mistral":
        return transformers.MistralForCausalLM(transformers.MistralConfig(**common, head_dim=64, sliding_window=WINDOW))
    if family == "phi3":
        config = transformers.Phi3Config(**{**common, "num_attention_heads": 2, "num_key_value_heads": 1},
                                         sliding_window=WINDOW - 1, pad_token_id=0)
        return transformers.Phi3ForCausalLM(config)
    if family == "gemma2":
        config = transformers.Gemma2Config(**common, **gemma, attn_logit_softcapping=5.0, final_logit_softcapping=5.0)
        return transformers.Gemma2ForCausalLM(config)
    config = transformers.Gemma3TextConfig(**common, **gemma, sliding_window_pattern=2)
    return transformers.Gemma3ForCausalLM(config)


@pytest.fixture(scope="module", params=["mistral", "phi3", "gemma2", "gemma3"])
def windowed_model(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory,
                   default_model_path: str) -> str:
    import torch
    import transformers

    torch.manual_seed(0)
    hf = _hf_model(request.param)
    path = tmp_path_factory.mktemp(f"windowed_{request.param}")
    hf.save_pretrained(path)
    transformers.AutoTokenizer.from_pretrained(default_model_path).save_pretrained(path)
    return str(path)


def _in_waves(sched: Any, io: Any) -> dict[str, dict[str, Any]]:
    """Request 1 alone, then the others: the second wave finds SHARED cached (with the radix cache)."""
    workload = windowed_prompts()
    results: dict[str, dict[str, Any]] = {}
    for wave in ([1], [i for i in range(len(workload)) if i != 1]):
        for i in wave:
            submit(io, f"w{i}", workload[i][0], ignore_eos=True, **workload[i][1])
        results.update(run_until_idle(sched, io))
    return results


def _run(path: str, config: Config) -> tuple[dict, int]:
    """(each request's tokens and finish, the most prompt tokens a request found cached)."""
    overlap, radix, chunk, page, mixed = config
    sched, io = make(path, max_total_tokens=4096, disable_overlap_schedule=not overlap, disable_radix_cache=not radix,
                     chunked_prefill_size=chunk, page_size=page, enable_mixed_chunk=mixed, dtype="float32")
    results = _in_waves(sched, io)
    return {rid: (r["ids"], r["finish"]) for rid, r in results.items()}, max(r["cached"] for r in results.values())


@pytest.fixture(scope="module")
def windowed_baseline(windowed_model: str) -> dict:
    return _run(windowed_model, BASELINE)[0]


@pytest.mark.parametrize("config", PAIRWISE, ids=[f"ov{o}-rx{r}-ch{c}-pg{p}-mx{m}" for o, r, c, p, m in PAIRWISE])
def test_same_tokens_every_configuration(windowed_model: str, windowed_baseline: dict, config: Config) -> None:
    results, cached = _run(windowed_model, config)
    assert results == windowed_baseline
    assert all(len(ids) == 16 for ids, _ in results.values())
    if config[1]:  # radix: a prefix longer than the window was served from the cache
        assert cached > WINDOW


def test_same_tokens_with_two_tensor_parallel_ranks(windowed_model: str, windowed_baseline: dict,
                                                    request: pytest.FixtureRequest) -> None:
    """Each rank holds half the heads, with the same windows (rank 1 a real process). In CI only
    on Gemma 2 (per-layer windows and the soft cap); every family with RADIXSERVE_FULL_TESTS=1."""
    if not FULL_TESTS and request.node.callspec.params["windowed_model"] != "gemma2":
        pytest.skip("a two-rank process per family: RADIXSERVE_FULL_TESTS=1")
    from runtime.contracts.config import ServerConfig
    from runtime.execution.resolve import resolve_config
    from tests.runtime.parallel.tp_harness import tp_scheduler
    from tests.scheduler.harness import FakeIO

    config = resolve_config(ServerConfig(
        model_path=windowed_model, device="cpu", dtype="float32", tp_size=2, max_total_tokens=4096,
        max_running_requests=16, chunked_prefill_size=32, enable_mixed_chunk=True))
    io = FakeIO()
    with tp_scheduler(config, io) as sched:
        results = _in_waves(sched, io)
    assert {rid: (r["ids"], r["finish"]) for rid, r in results.items()} == windowed_baseline
