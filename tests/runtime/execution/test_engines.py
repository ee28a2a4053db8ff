"""The engines chosen at start-up (runtime/execution/engines.py): the decision from measured times,
batch invariance by default (nothing switched, nothing copied, the cascade off), and the dense
engine, when taken, computing the same linear as the blocks within the 8-bit activations' error."""

from __future__ import annotations

import pytest
import torch

from kernels import block_engines
from kernels import gguf_blocks as gb
from kernels.linear import Linear
from kernels.quant_linear import BlockQuantLinearMethod, install
from kernels.torch_backend import TorchAttentionBackend
from runtime.execution import engines
from runtime.execution.cpu_kernels import load_cpu_kernels
from runtime.execution.device import cpu_capability
from runtime.execution.static_batch import StaticBatch


@pytest.mark.parametrize("speedups,want", [
    ({64: 0.8, 256: 1.0, 1024: 1.05}, None),  # never by the margin
    ({64: 0.9, 256: 1.2, 1024: 1.5}, 256),
    ({64: 1.3, 256: 0.9, 1024: 1.3}, 1024),  # a win below a loss does not count
    ({64: 2.0, 256: 2.0, 1024: 2.0}, 64),
])
def test_the_dense_engine_starts_where_it_wins_from_there_on(speedups: dict[int, float], want: int | None) -> None:
    assert engines.dense_from_rows(speedups) == want


def _block_linear(dtype: torch.dtype) -> tuple[Linear, BlockQuantLinearMethod]:
    kernels = load_cpu_kernels()
    assert kernels is not None, "make setup builds the kernels"
    gen = torch.Generator().manual_seed(5)
    layer = Linear(96, 48, bias=False, dtype=dtype)  # int4pack needs 16 | out
    install(layer, gb.quantize(torch.randn(48, 96, generator=gen) * 0.1, gb.FORMATS["q4_1"]), gb.FORMATS["q4_1"],
            kernels, cpu_capability().block_kernel_isa)
    assert isinstance(layer.method, BlockQuantLinearMethod)
    return layer, layer.method


@pytest.mark.parametrize("make", block_engines.CANDIDATES, ids=lambda make: make.__name__)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_library_engine_computes_the_blocks_linear(make, dtype: torch.dtype) -> None:
    layer, method = _block_linear(dtype)
    x = torch.randn(12, 96).to(dtype)
    blocks = layer(x)
    engine = make(method.row_blocks(), method.fmt, dtype)
    if engine is None:
        pytest.skip(f"{make.__name__} cannot run {dtype} here")
    method.use_dense(engine, from_rows=8)
    assert torch.equal(layer(x[:7]), blocks[:7])  # below the threshold: the blocks, bit for bit
    weight = gb.dequantize(method.row_blocks(), method.fmt).double()
    want = x.double() @ weight.T
    # A library engine rounds x, the products and (int4pack) its scales to the activations'
    # dtype: bf16 to 2^-8 of each, so 2^-7 of the terms' magnitudes bounds both; fp32 sums stay
    # far inside 1e-5 of them at these 96 terms.
    unit = 2**-7 if dtype == torch.bfloat16 else 1e-5
    bound = (x.double().abs() @ weight.abs().T) * unit + 1e-6
    assert ((layer(x).double() - want).abs() <= bound).all()
    assert method.nbytes == method.grouped.numel() + engine.nbytes


@pytest.fixture(scope="module")
def shipped() -> StaticBatch:
    """The shipped default model as serving loads it (no flags)."""
    return StaticBatch.create(None, max_total_tokens=512, max_running_requests=2)  # type: ignore[arg-type]


def test_by_default_nothing_is_switched_and_the_cascade_is_off(shipped: StaticBatch) -> None:
    """The shipped default: every block linear keeps its blocks alone, our prefill kernel stays,
    the cascade is off; every op and shape has a logged choice that says why."""
    choices = shipped.runner.loaded.engines
    gemms = [c for c in choices if c.op == "block GEMM"]
    assert {c.shape.split(" x")[0] for c in gemms} == {"q4_1 576->960", "q4_1 576->576", "q4_1 576->3072",
                                                      "q4_1 1536->576"}
    assert all(c.engine.startswith("blocks-") and c.why for c in gemms)
    methods = [m.method for m in shipped.runner.model.modules() if isinstance(getattr(m, "method", None),
                                                                             BlockQuantLinearMethod)]
    assert methods and all(m.dense is None for m in methods)
    backend = shipped.runner.backend
    assert isinstance(backend, TorchAttentionBackend) and backend.extend_kernel is not None
    assert not backend.decoder.cascade
    assert [c.engine for c in choices if c.op in ("prefill attention", "decode cascade")] == ["ours", "off"]


def test_batch_variance_turns_the_cascade_on(default_model_path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(engines, "ROW_PROBES", (64,))  # the decision is tested above; this is the wiring
    monkeypatch.setattr(engines, "PREFILL_PROBES", ((32, 0),))
    engine = StaticBatch.create(None, max_total_tokens=512, max_running_requests=2,  # type: ignore[arg-type]
                                enable_batch_variance=True)
    assert engine.runner.backend.decoder.cascade  # type: ignore[attr-defined]
    assert [c.engine for c in engine.runner.loaded.engines if c.op == "decode cascade"] == ["on"]


def test_per_window_backends_share_the_choices_and_a_soft_cap_keeps_the_cascade_off(tmp_path) -> None:
    """Gemma 2 (sliding and global layers, soft-capped): one torch backend per window, neither on
    our C++ attention kernels nor the cascade, even with --enable-batch-variance."""
    from kernels.sliding_window import PerLayerBackend
    from tests.kernels.test_flashinfer_windows import _write

    batch = StaticBatch.create(_write(tmp_path / "gemma2", "gemma2"), load_format="dummy", max_total_tokens=512,
                               max_running_requests=2, enable_batch_variance=True)
    backend = batch.runner.backend
    assert isinstance(backend, PerLayerBackend) and len(backend.backends) == 2
    for each in backend.backends.values():
        assert isinstance(each, TorchAttentionBackend) and each.extend_kernel is None and not each.decoder.cascade
    assert [c.engine for c in batch.runner.loaded.engines if c.op == "decode cascade"] == ["off"]
