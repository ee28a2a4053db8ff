"""A whole model with our fused C++ CPU ops (kernels/fused_ops.py CpuFusedOps: RMSNorm, SiLU * up,
rotary) against the same model with them switched off (the kernels' own tests, against float64
references, are in tests/kernels/csrc/test_elementwise.py)."""

from __future__ import annotations

import pytest


@pytest.mark.parametrize("dtype,tol", [("float32", 1e-5), ("bfloat16", 2e-2)])
def test_model_with_kernels_matches_without(default_model_path: str, dtype: str, tol: float) -> None:
    """One loaded model, run with its kernels and then with them switched off (a model load
    costs more than the forwards; the weights are the same either way)."""
    from runtime.execution.static_batch import StaticBatch

    prompt = list(range(200, 260))
    engine = StaticBatch.create(default_model_path, dtype=dtype, max_total_tokens=512, max_running_requests=2)
    assert engine.runner.backend.decoder.kernels is not None  # the first run goes through them
    logits = []
    for with_kernels in (True, False):
        if not with_kernels:
            engine.runner.model.use_fused_ops(None)
            engine.runner.backend.decoder.kernels = None
        seq = engine.new_seq(prompt)
        for token in (300, 301, 302, 303):  # the same tokens for both: prefill, then decode steps
            result = engine.step([seq], keep_logits=True)
            seq.tokens.append(token)
        logits.append(result.last_logits[0])
        engine.release([seq])
    err = ((logits[0] - logits[1]).norm() / logits[1].norm()).item()
    assert err <= tol, err
