"""Kernel launches of a decode step on the FlashInfer path (its stand-in, on CPU): each layer is
about the ten launches SGLang's is, thanks to FlashInfer's fused per-token kernels.

A TorchDispatchMode counts the aten ops that would launch a kernel (views and allocations do not);
each FlashInfer call counts as one launch, whatever its stand-in runs inside. Counted at 2 and 4
layers, the difference gives the per-layer count, the rest the step's fixed count.
"""

from __future__ import annotations

import collections
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes

from runtime.execution.forward_batch import ForwardEntry
from tests.kernels import fake_flashinfer as fake
from tests.runtime.execution.tiny_runner import SHAPES, fake_flashinfer, make_runner, write_config  # noqa: F401

NOT_LAUNCHES = {"empty", "empty_strided", "detach_"}  # allocations and metadata


class LaunchCounter(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.ops: collections.Counter[str] = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        name = func.overloadpacket.__name__
        if not func.is_view and name not in NOT_LAUNCHES:
            self.ops[name] += 1
        return func(*args, **(kwargs or {}))


def _one_launch(name: str, fn: Callable[..., Any], calls: collections.Counter[str]) -> Callable[..., Any]:
    def launched(*args: Any, **kwargs: Any) -> Any:
        calls[name] += 1
        with _disable_current_modes():  # the stand-in's torch ops stand for one kernel
            return fn(*args, **kwargs)

    return launched


def _decode_launches(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, layers: int, fused: bool) -> int:
    runner = make_runner(write_config(tmp_path / f"m{layers}", *SHAPES["llama-3.2-1b"], layers=layers),
                         backend="fake-flashinfer", dtype="bfloat16")
    if not fused:
        runner.model.use_fused_ops(None)
    calls: collections.Counter[str] = collections.Counter()
    module = sys.modules["flashinfer"]
    for name in ("rmsnorm", "fused_add_rmsnorm", "silu_and_mul", "apply_rope_with_cos_sin_cache_inplace"):
        monkeypatch.setattr(module, name, _one_launch(name, getattr(module, name), calls))
    for cls in (fake.BatchDecodeWithPagedKVCacheWrapper, fake.BatchPrefillWithPagedKVCacheWrapper):
        for method in ("plan", "run"):  # plan(): its one copy of the schedule to the device
            monkeypatch.setattr(cls, method, _one_launch(method, getattr(cls, method), calls))
    prompts = [ForwardEntry(row=r, input_ids=[3, 4, 5], prefix_len=0, kv_write=[8 * r + 1, 8 * r + 2, 8 * r + 3],
                            kv_write_start=0) for r in range(4)]
    runner.forward(prompts)
    decodes = [ForwardEntry(row=r, input_ids=[6], prefix_len=3, kv_write=[8 * r + 4], kv_write_start=3)
               for r in range(4)]
    calls.clear()
    with LaunchCounter() as counter:
        runner.forward(decodes)
    return sum(counter.ops.values()) + sum(calls.values())


def test_a_decode_layer_is_eleven_launches_with_flashinfers_fused_kernels(tmp_path, monkeypatch,
                                                                         fake_flashinfer) -> None:  # noqa: F811
    fused = {n: _decode_launches(tmp_path, monkeypatch, n, fused=True) for n in (2, 4)}
    plain = {n: _decode_launches(tmp_path, monkeypatch, n, fused=False) for n in (2, 4)}
    per_layer, plain_per_layer = (fused[4] - fused[2]) // 2, (plain[4] - plain[2]) // 2
    # Per layer: 4 GEMMs, the rotary, K and V written (two copies), attention, 2 fused
    # add+norms, SiLU * up. SGLang's is about 10 (it writes K and V in one kernel).
    assert per_layer <= 11, per_layer
    assert plain_per_layer >= per_layer + 6, (plain_per_layer, per_layer)  # casts, adds, cat/mul/addcmul, silu
    # The step's own launches (measured 26): inputs and the page list, embedding, rotary lookup,
    # final norm, head, sampling, the future map, the copy of the ids back.
    assert fused[2] - 2 * per_layer <= 30, fused[2] - 2 * per_layer


def test_a_graph_replay_gathers_its_page_list_straight_into_the_wrappers_buffer(
        tmp_path, monkeypatch, fake_flashinfer) -> None:  # noqa: F811
    """plan() in graph mode copies the page list into the wrappers' shared buffer: gathered there
    already, that copy is onto itself, which torch skips (no kernel)."""
    runner = make_runner(write_config(tmp_path / "m", *SHAPES["llama-3.2-1b"]), backend="fake-flashinfer",
                         dtype="bfloat16")
    prompts = [ForwardEntry(row=r, input_ids=[3, 4, 5], prefix_len=0, kv_write=[8 * r + 1, 8 * r + 2, 8 * r + 3],
                            kv_write_start=0) for r in range(3)]
    runner.forward(prompts)
    runner.init_cuda_graphs(4, capture=False)
    handed: list[int] = []
    plan = fake.BatchDecodeWithPagedKVCacheWrapper.plan

    def recorded(self, indptr, indices, *args, **kwargs):  # type: ignore[no-untyped-def]
        handed.append(indices.data_ptr())
        return plan(self, indptr, indices, *args, **kwargs)

    monkeypatch.setattr(fake.BatchDecodeWithPagedKVCacheWrapper, "plan", recorded)
    decodes = [ForwardEntry(row=r, input_ids=[6], prefix_len=3, kv_write=[8 * r + 4], kv_write_start=3)
               for r in range(3)]
    runner.forward(decodes)  # 3 rows in the bucket of 4
    assert handed == [runner.backend.graph_page_list().data_ptr()]
