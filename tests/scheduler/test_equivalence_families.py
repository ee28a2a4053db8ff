"""The equivalence grid (tests/scheduler/test_equivalence.py) for the model families beyond the
default model's Llama: Phi-3 (fused checkpoint projections), Mistral (Llama's decoder) and
Qwen3-MoE (q/k norms, sparse expert blocks whose routing is a discrete choice per token), each a
tiny random-weight model in fp32. Greedy tokens must not depend on overlap, the radix cache,
chunking, page size or mixed batches: the PAIRWISE rows against the baseline row, per family,
and one row with two tensor-parallel ranks (a real rank-1 process)."""

from __future__ import annotations

import random

import pytest

from tests import FULL_TESTS
from tests.scheduler.harness import VOCAB
from tests.scheduler.test_equivalence import BASELINE, GRID, PAIRWISE, Config, run, run_two_ranks

pytestmark = pytest.mark.slow

COMMON = dict(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
              vocab_size=VOCAB, max_position_embeddings=512, eos_token_id=2, tie_word_embeddings=False)
# family -> (config class, model class, its own settings)
FAMILIES: dict[str, tuple[str, str, dict]] = {
    # Phi3Config's default pad_token_id (32000) is past the tiny vocabulary.
    "phi3": ("Phi3Config", "Phi3ForCausalLM", dict(num_hidden_layers=2, pad_token_id=0)),
    "mistral": ("MistralConfig", "MistralForCausalLM", dict(num_hidden_layers=2, sliding_window=None)),
    "qwen3_moe": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM", dict(
        num_hidden_layers=3, head_dim=16, moe_intermediate_size=32, num_experts=8, num_experts_per_tok=2,
        mlp_only_layers=[0], norm_topk_prob=True)),
}
CONFIGS = GRID if FULL_TESTS else PAIRWISE
SYSTEM = list(range(100, 140))  # a shared 40-token "system prompt" inside the tiny vocabulary


def prompts() -> list[tuple[list[int], dict]]:
    """test_equivalence's workload inside the tiny vocabulary: shared prefixes, chunked lengths."""
    rng = random.Random(3)
    out = []
    for i in range(10):
        own = [rng.randrange(3, VOCAB) for _ in range(rng.randrange(3, 70))]
        params: dict = {"max_new_tokens": 12}
        if i % 4 == 1:
            params["stop"] = [".", " the"]
        out.append((SYSTEM + own if i % 3 else own, params))
    return out


@pytest.fixture(scope="module", params=list(FAMILIES))
def family_model(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory,
                 default_model_path: str) -> str:
    """A tiny checkpoint of the family with the default model's tokenizer. Weights of std 0.2 (not
    HF's 0.02) give peaked logits and routers, so no greedy token or expert choice is a near tie."""
    import torch
    import transformers

    config_cls, model_cls, extra = FAMILIES[request.param]
    torch.manual_seed(0)
    hf = getattr(transformers, model_cls)(getattr(transformers, config_cls)(**COMMON, **extra))
    with torch.no_grad():
        for name, p in hf.named_parameters():
            p.normal_(1.0 if "norm" in name else 0.0, 0.2)
    path = tmp_path_factory.mktemp(request.param)
    hf.save_pretrained(path)
    transformers.AutoTokenizer.from_pretrained(default_model_path).save_pretrained(path)
    return str(path)


def options(row: Config) -> dict:
    overlap, radix, chunk, page, mixed = row
    return dict(disable_overlap_schedule=not overlap, disable_radix_cache=not radix, chunked_prefill_size=chunk,
                page_size=page, enable_mixed_chunk=mixed, dtype="float32")


def test_same_tokens_every_configuration(family_model: str) -> None:
    baseline, _ = run(family_model, prompts, **options(BASELINE))
    assert len(baseline) == 10 and all(len(ids) > 0 for ids, _ in baseline.values())
    for row in CONFIGS:
        results, sched = run(family_model, prompts, **options(row))
        assert results == baseline, row
        overlap, radix, chunk, page, mixed = row
        if mixed and chunk > 0:  # chunked prompts keep others decoding: some forwards were mixed
            assert sched.batcher.mixed_steps > 0, row


def test_same_tokens_with_two_tensor_parallel_ranks(family_model: str, request: pytest.FixtureRequest) -> None:
    """Rank 0's scheduler here leading a real rank-1 process (test_equivalence.py's TP row). In CI
    only for Qwen3-MoE (its experts split by rank); every family with RADIXSERVE_FULL_TESTS=1."""
    if not FULL_TESTS and request.node.callspec.params["family_model"] != "qwen3_moe":
        pytest.skip("a two-rank process per family: RADIXSERVE_FULL_TESTS=1")
    from runtime.contracts.config import ServerConfig
    from runtime.execution.resolve import resolve_config

    baseline, _ = run(family_model, prompts, **options(BASELINE))
    row = options((False, True, 32, 1, True))
    config = resolve_config(ServerConfig(model_path=family_model, device="cpu", tp_size=2, max_total_tokens=8192,
                                         max_running_requests=16, **row))
    assert run_two_ranks(config, prompts) == baseline
