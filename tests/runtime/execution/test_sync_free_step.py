"""A decode step makes one upload and no host wait until its sampled ids are read.

On CPU nothing really waits, so the step runs under a recorder (a TorchFunctionMode) that flags
every call which, on a GPU, would block the host: reading values (`tolist`, `item`, `bool`),
data-dependent shapes (`nonzero`, boolean-mask indexing), and tensors built from host data with
a `device=` (a blocking copy from pageable memory). The runner's host<->device traffic goes
through kernels/transfer.py, whose counters say how many uploads and waits the step made. The
attention runs in our FlashInfer backend over the stand-in module, whose own work (the GPU's) is
hidden from the recorder.
"""

from __future__ import annotations

import pytest
import torch
from torch.overrides import TorchFunctionMode

import kernels.sampling
from kernels.transfer import STATS
from runtime.contracts.sampling import SamplingParams
from runtime.execution.forward_batch import ForwardEntry
from tests.runtime.execution.tiny_runner import SHAPES, fake_flashinfer, make_runner, write_config  # noqa: F401

Tensor = torch.Tensor
READS = {Tensor.tolist, Tensor.item, Tensor.__bool__, Tensor.__int__, Tensor.__float__, Tensor.cpu, Tensor.numpy,
         Tensor.nonzero, torch.nonzero, torch.masked_select, Tensor.masked_select, torch.unique, Tensor.unique}
FACTORIES = {torch.tensor, torch.as_tensor}


class SyncRecorder(TorchFunctionMode):
    def __init__(self) -> None:
        super().__init__()
        self.calls: list[str] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        kwargs = kwargs or {}
        if func in READS:
            self.calls.append(getattr(func, "__name__", str(func)))
        elif func in FACTORIES and kwargs.get("device") is not None:
            self.calls.append(f"{func.__name__}(device=...)")
        elif func in (Tensor.__getitem__, Tensor.__setitem__) and _has_bool_index(args[1]):
            self.calls.append("boolean-mask indexing")
        return func(*args, **kwargs)


def _has_bool_index(index: object) -> bool:
    parts = index if isinstance(index, tuple) else (index,)
    return any(isinstance(p, Tensor) and p.dtype == torch.bool for p in parts)


@pytest.fixture
def runner(tmp_path, fake_flashinfer):  # noqa: F811
    return make_runner(write_config(tmp_path / "m", *SHAPES["llama-3.2-1b"]), backend="fake-flashinfer", page_size=4,
                       dtype="bfloat16")  # FlashInfer has no fp32 kernels


def _prefill_then_decodes(runner, sampling: SamplingParams, n: int = 4) -> list[ForwardEntry]:
    entries, decodes = [], []
    for row in range(n):
        length = 6 + 3 * row
        base = 40 * (row + 1)  # page-aligned for page size 4; page 0 is padding
        slots = list(range(base, base + length + 1))
        ids = [(row + i) % 400 + 1 for i in range(length)]
        entries.append(ForwardEntry(row=row, input_ids=ids, prefix_len=0, kv_write=slots[:-1], kv_write_start=0))
        decodes.append(ForwardEntry(row=row, input_ids=[0], prefix_len=length, kv_write=slots[-1:],
                                    kv_write_start=length, sampling=sampling, input_from_future=True))
    runner.forward(entries).host_next_ids()
    return decodes


@pytest.mark.parametrize("sampling", [SamplingParams(temperature=0.0),
                                      SamplingParams(temperature=0.8, top_p=0.9, top_k=20)], ids=["greedy", "top-p"])
def test_decode_step_uploads_once_and_waits_only_for_its_ids(runner, sampling: SamplingParams, monkeypatch) -> None:
    # The sampler's GPU way (on CPU it may read a flag back: free there, and it saves a sort).
    monkeypatch.setattr(kernels.sampling, "sync_free", lambda device: True)
    decodes = _prefill_then_decodes(runner, sampling)
    STATS.reset()
    with SyncRecorder() as recorder:
        result = runner.forward(decodes)
    assert recorder.calls == [], recorder.calls
    greedy = sampling.is_greedy
    # greedy: the step's one packed upload; sampling adds its per-row parameters (asynchronous too).
    assert STATS.uploads == 1 if greedy else STATS.uploads > 1
    assert STATS.syncs == 0
    ids = result.host_next_ids()
    assert len(ids) == 4 and STATS.syncs == 1
    result.host_next_ids()
    assert STATS.syncs == 1  # read once


def test_the_recorder_sees_what_it_must() -> None:
    t = torch.arange(4)
    with SyncRecorder() as recorder:
        t.tolist()
        bool(t.sum())
        t[t > 1]
        torch.tensor([1, 2], device="cpu")
    assert recorder.calls == ["tolist", "__bool__", "boolean-mask indexing", "tensor(device=...)"]
