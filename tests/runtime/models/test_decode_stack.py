"""A decode step's layers as one C++ call each (runtime/models/decode_stack.py) against the same
layers in Python: the default model's shipped Q4_1 blocks, both activation dtypes, and a K-quant
mix of it, logits bit for bit; and the batches and models it must leave to Python."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from kernels import decode_attention
from kernels.torch_backend import TorchAttentionBackend
from runtime.execution.static_batch import Seq, StaticBatch
from runtime.models.decode_stack import DecodeStack
from runtime.support.default_model import gguf_path

PROMPTS = [[1, 9690, 30, 2683, 314, 253, 1789], list(range(200, 261)), [42] * 19]


@pytest.fixture(scope="module", params=["float32", "bfloat16"])
def engine(request: pytest.FixtureRequest) -> StaticBatch:
    return StaticBatch.create(str(gguf_path()), load_format="gguf", dtype=request.param, max_total_tokens=512,
                              max_running_requests=len(PROMPTS), context_length=128)


def _decode_logits(engine: StaticBatch, stack: DecodeStack | None, steps: int) -> list[torch.Tensor]:
    engine.runner.model.model.decode_stack = stack
    seqs = [engine.new_seq(p) for p in PROMPTS]
    engine.append(seqs, engine.step(seqs))
    logits = []
    for _ in range(steps):
        result = engine.step(seqs, keep_logits=True)
        assert result.last_logits is not None
        logits.append(result.last_logits.clone())
        engine.append(seqs, result)
    engine.release(seqs)
    return logits


def test_stack_runs_the_python_layers_bit_for_bit(engine: StaticBatch) -> None:
    stack = engine.runner.model.model.decode_stack
    assert stack is not None, "the default model's blocks run as one call per layer"
    calls = []
    original = stack.run

    def counted(*args: object, **kw: object) -> object:
        out = original(*args, **kw)  # type: ignore[arg-type]
        calls.append(out is not None)
        return out

    stack.run = counted  # type: ignore[method-assign,assignment]
    try:
        ours = _decode_logits(engine, stack, steps=5)
    finally:
        del stack.run
    assert calls == [True] * 5, "every decode step (and no prefill) ran through the stack"
    python = _decode_logits(engine, None, steps=5)
    engine.runner.model.model.decode_stack = stack
    for step, (a, b) in enumerate(zip(ours, python)):
        assert torch.equal(a, b), f"decode step {step}: logits differ by {(a - b).abs().max()}"


@pytest.mark.slow
def test_a_kquant_mix_with_fused_layers_of_two_formats_runs_bit_for_bit(kquant_mix_file: Path) -> None:
    """Q4_K/Q5_K/Q6_K, q5_0, q5_1 and q8_0 blocks, a fused q/k/v in two formats (q5_0 q and k,
    q8_0 v: two kernel calls in the layer's one): the stack's logits are the Python layers'."""
    engine = StaticBatch.create(str(kquant_mix_file), load_format="gguf", dtype="bfloat16", max_total_tokens=512,
                                max_running_requests=len(PROMPTS), context_length=128)
    stack = engine.runner.model.model.decode_stack
    assert stack is not None and stack.layers[0].parts == [2, 1, 1, 1]
    ours = _decode_logits(engine, stack, steps=3)
    python = _decode_logits(engine, None, steps=3)
    for step, (a, b) in enumerate(zip(ours, python)):
        assert torch.equal(a, b), f"decode step {step}: logits differ by {(a - b).abs().max()}"


def _shared_rows(engine: StaticBatch, prefix: list[int], owns: list[list[int]]) -> tuple[Seq, list[Seq]]:
    """Rows that hold the KV slots of an owner's prefix, as the radix cache hands them over,
    each after its own prompt's prefill."""
    owner = engine.new_seq(prefix)
    engine.step([owner])
    rows = []
    for own in owns:
        row = engine.new_seq(prefix + own)
        row.kv, row.computed = list(owner.kv[: len(prefix)]), len(prefix)
        engine.runner.req_to_token.table[row.row, : len(prefix)] = torch.tensor(row.kv, dtype=torch.int32)
        rows.append(row)
    engine.append(rows, engine.step(rows))
    return owner, rows


def _shared_prefix_logits(engine: StaticBatch, stack: DecodeStack | None, steps: int) -> list[torch.Tensor]:
    engine.runner.model.model.decode_stack = stack
    prefix = list(range(300, 340))
    owner, rows = _shared_rows(engine, prefix, [[7, 8, 9], list(range(500, 511))])
    logits = []
    for _ in range(steps):
        result = engine.step(rows, keep_logits=True)
        assert result.last_logits is not None
        logits.append(result.last_logits.clone())
        engine.append(rows, result)
        decoder = engine.runner.backend.decoder  # type: ignore[attr-defined]
        assert decoder.shared_index is not None and len(decoder.shared_index) == len(prefix)
    for row in rows:
        engine.allocator.free(row.kv[len(prefix) :])
        engine.runner.req_to_token.free(row.row)
    engine.release([owner])
    return logits


def test_stack_attends_a_shared_prefix_once_bit_for_bit(engine: StaticBatch, monkeypatch: pytest.MonkeyPatch) -> None:
    """Rows sharing a KV prefix: the stack's cascade_attention is the Python path's, logits bit for
    bit (the thresholds lowered so that two rows over 40 tokens take the cascade)."""
    monkeypatch.setitem(decode_attention.CASCADE_MIN, "kernel", (2, 8))
    monkeypatch.setattr(engine.runner.backend.decoder, "cascade", True)  # --enable-batch-variance
    stack = engine.runner.model.model.decode_stack
    ours = _shared_prefix_logits(engine, stack, steps=4)
    python = _shared_prefix_logits(engine, None, steps=4)
    engine.runner.model.model.decode_stack = stack
    for step, (a, b) in enumerate(zip(ours, python)):
        assert torch.equal(a, b), f"decode step {step}: logits differ by {(a - b).abs().max()}"


def test_backend_offers_decode_batches_only(engine: StaticBatch) -> None:
    """Prefill batches run the Python layers; decode batches, the stack."""
    runner = engine.runner
    assert isinstance(runner.backend, TorchAttentionBackend)
    seqs = [engine.new_seq(p) for p in PROMPTS[:2]]
    runner.backend.plan(runner.prepare([engine.entry(s, len(s.tokens)) for s in seqs]).meta)
    assert runner.backend.decode_kernel_inputs() is None, "a prefill batch runs the Python layers"
    engine.append(seqs, engine.step(seqs))
    runner.backend.plan(runner.prepare([engine.entry(s, len(s.tokens)) for s in seqs]).meta)
    inputs = runner.backend.decode_kernel_inputs()
    lens = [len(PROMPTS[0]) + 1, len(PROMPTS[1]) + 1]
    assert inputs is not None and inputs.indptr.tolist() == [0, lens[0], lens[0] + lens[1]]
    engine.release(seqs)


def test_full_precision_layers_stay_in_python(default_model_path: str) -> None:
    engine = StaticBatch.create(default_model_path, dtype="float32", max_total_tokens=256, max_running_requests=1)
    assert engine.runner.model.model.decode_stack is None
    decoder = engine.runner.model.model
    decoder.use_decode_stack(None)  # nor without the built kernels
    assert decoder.decode_stack is None
