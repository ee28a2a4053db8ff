"""GGUF blocks on the default model against its full-precision self (fp32 on every CPU):
the shipped Q4_1 file run from its blocks (`--load-format gguf`) against the folder it converts
to, a K-quant mix of it (tests/runtime/execution/kquant_mix.py: Q4_K/Q5_K/Q6_K, q5_0, q5_1, q8_0,
a fused q/k/v of two formats) written as a .gguf file and run from its blocks, and the folder
quantized at load (`--quantization q8_0|q4_0`) against the folder.

Teacher-forced, as tests/runtime/execution/test_quantization.py measures int8 (see there why):
the mean per-token log-prob drift of the full-precision model's greedy answers to 4 chat
prompts, and the share of positions whose argmax is the reference token. Measured on the
AVX-512 machine (fp32; bars with a margin for the AVX2 one, whose sums round differently):
gguf Q4_1 drift 0.008-0.025 per prompt, 123/128 agreeing; q8_0 0.004-0.017, 117/128 (every call
on 8-bit activations, the kernel since 2026-12-02); q4_0 0.11-0.44, 98/128 before that (q4_0
re-quantizes weights that are already Q4_1's, so its error stacks).
"""

from __future__ import annotations

import pytest

from kernels.quant_linear import BlockPartsLinearMethod, BlockQuantLinearMethod
from runtime.execution.static_batch import StaticBatch
from tests import FULL_TESTS
from tests.runtime.execution.teacher_forcing import drift_and_agreement, greedy_and_scored, score

pytestmark = pytest.mark.slow

CHAT_PROMPTS = 4
NEW_TOKENS = 32
BARS = {  # (mean drift in nats/token at most, argmax agreement at least)
    "gguf": (0.05, 0.85),
    "q8_0": (0.05, 0.85),
    "kquant-mix": (0.2, 0.75),  # measured 0.12 and 0.81; the plain fp32 product of the same blocks 0.12, 0.84
    "q4_0": (0.6, 0.6),
}
# q4_0 is neither the shipped format nor the head's: its row runs in the long form of the suite
# (RADIXSERVE_FULL_TESTS=1), which CI leaves out for time.
SOURCES = ["gguf", "q8_0", "kquant-mix"] + (["q4_0"] if FULL_TESTS else [])
KW = dict(dtype="float32", max_total_tokens=2048, max_running_requests=CHAT_PROMPTS)


@pytest.fixture(scope="module")
def references(default_model_path: str, chat_ids) -> tuple[list[list[int]], list, list[list[int]]]:
    prompts = chat_ids[:CHAT_PROMPTS]
    answers, scored = greedy_and_scored(StaticBatch.create(default_model_path, **KW), prompts, NEW_TOKENS)
    return prompts, scored, answers


@pytest.mark.parametrize("source", SOURCES)
def test_blocks_meet_the_accuracy_bar(default_model_path: str, references, source: str,
                                      request: pytest.FixtureRequest) -> None:
    from runtime.support.default_model import gguf_path

    prompts, bases, answers = references
    if source == "gguf":
        engine = StaticBatch.create(str(gguf_path()), load_format="gguf", **KW)
    elif source == "kquant-mix":
        mix = request.getfixturevalue("kquant_mix_file")
        engine = StaticBatch.create(str(mix), load_format="gguf", **KW)
        model = engine.runner.model.model
        assert [model.layers[i].mlp.down_proj.method.fmt.name for i in range(3)] == ["q4_k", "q5_k", "q6_k"]
        assert isinstance(model.layers[0].self_attn.qkv_proj.method, BlockPartsLinearMethod)  # q5_0 q, k; q8_0 v
        assert model.embed_tokens.blocks is not None and model.decode_stack is not None
    else:
        engine = StaticBatch.create(default_model_path, quantization=source, **KW)
    layer = engine.runner.model.model.layers[0].mlp.down_proj
    assert isinstance(layer.method, BlockQuantLinearMethod) and layer.weight is None
    ours = score(engine, prompts, answers)
    drift, agreeing = drift_and_agreement(ours, bases, answers)
    agree = agreeing / (len(prompts) * NEW_TOKENS)
    print(f"{source}: drift per prompt {[round(d, 4) for d in drift]}, argmax agreement {agree:.3f}")
    max_drift, min_agree = BARS[source]
    assert sum(drift) / len(drift) <= max_drift, drift
    assert agree >= min_agree, agree
