"""Our FlashInfer backend with sliding windows, a softmax scale and soft caps, over the stand-in
module (tests/kernels/fake_flashinfer.py, which applies FlashInfer's documented `window_left`:
a query at i sees keys i - window_left .. i): plan() gets window_left = window - 1, and a runner
on it gives the torch backend's logits on Gemma 2 / Gemma 3 / Mistral-shaped dummy models."""

from __future__ import annotations

import json

import pytest
import torch

from kernels.sliding_window import PerLayerBackend
from tests.kernels import fake_flashinfer as fake
from tests.kernels.backend_scenarios import BF16_LOGIT_TOLERANCE, SCENARIOS, max_logit_error, run_scenario
from tests.runtime.execution.tiny_runner import fake_flashinfer, make_runner  # noqa: F401

WINDOW = 16
CONFIGS = {
    "gemma2": dict(architectures=["Gemma2ForCausalLM"], sliding_window=WINDOW, query_pre_attn_scalar=48,
                   attn_logit_softcapping=3.0, final_logit_softcapping=20.0),
    "gemma3": dict(architectures=["Gemma3ForCausalLM"], sliding_window=WINDOW, query_pre_attn_scalar=64,
                   layer_types=["sliding_attention", "full_attention"], rope_local_base_freq=10000.0),
    "mistral": dict(architectures=["MistralForCausalLM"], sliding_window=WINDOW),
}


def _write(folder, family: str) -> str:  # type: ignore[no-untyped-def]
    folder.mkdir(parents=True, exist_ok=True)
    config = dict(hidden_size=128, head_dim=64, intermediate_size=256, num_hidden_layers=2, num_attention_heads=8,
                  num_key_value_heads=2, vocab_size=512, max_position_embeddings=512, rms_norm_eps=1e-6,
                  tie_word_embeddings=True, torch_dtype="float32", **CONFIGS[family])
    (folder / "config.json").write_text(json.dumps(config))
    return str(folder)


def test_plan_gets_the_window_scale_and_soft_cap(tmp_path, fake_flashinfer) -> None:  # noqa: F811
    runner = make_runner(_write(tmp_path / "m", "gemma2"), backend="fake-flashinfer", dtype="bfloat16")
    assert isinstance(runner.backend, PerLayerBackend) and set(runner.backend.backends) == {WINDOW, None}
    runner.warmup()
    windows = {args["window_left"] for _, args in fake.PLANS}
    assert windows == {WINDOW - 1, -1}  # HF's window of w keys (the query's own included): w - 1 to its left
    assert {args["logits_soft_cap"] for _, args in fake.PLANS} == {3.0}
    assert {args["sm_scale"] for _, args in fake.PLANS} == {48**-0.5}


@pytest.mark.parametrize("family", sorted(CONFIGS))
@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_windowed_runner_on_flashinfer_matches_torch_backend(tmp_path, fake_flashinfer, family, page_size,  # noqa: F811
                                                             scenario) -> None:
    path = _write(tmp_path / "m", family)
    ours = run_scenario(make_runner(path, backend="fake-flashinfer", page_size=page_size, dtype="bfloat16"), scenario,
                        decode_steps=4)
    torch_backend = run_scenario(make_runner(path, page_size=page_size, dtype="bfloat16"), scenario, decode_steps=4)
    # Gemma rounds to bf16 at more points (four norms a layer, the scaled embedding): twice the
    # bound. A window off by one key is 5 to 50 times further off than that.
    assert max_logit_error(ours, torch_backend) < BF16_LOGIT_TOLERANCE * (2 if family.startswith("gemma") else 1)


def test_graph_replay_with_per_layer_windows_matches_eager(tmp_path, fake_flashinfer) -> None:  # noqa: F811
    """Decode graphs over a PerLayerBackend: each window's backend has its own graph wrappers."""
    from tests.runtime.execution.test_cuda_graph import _decode_batch

    runner = make_runner(_write(tmp_path / "m", "gemma2"), backend="fake-flashinfer", page_size=4, dtype="bfloat16")
    decodes = _decode_batch(runner, [5, 20, 30])  # two of them past the window
    eager = runner.forward(decodes, keep_logits=True)
    runner.init_cuda_graphs(8, capture=False)
    graph = runner.forward(decodes, keep_logits=True)  # 3 rows in the bucket of 4
    assert graph.host_next_ids() == eager.host_next_ids()
    torch.testing.assert_close(graph.last_logits, eager.last_logits, rtol=1e-4, atol=1e-4)
    graph_plans = [args for kind, args in fake.PLANS[-2:]]
    assert [len(a["last_page_len"]) for a in graph_plans] == [4, 4]  # both windows' graph wrappers planned
    assert {a["window_left"] for a in graph_plans} == {WINDOW - 1, -1}
