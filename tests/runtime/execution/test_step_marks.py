"""Where a step's device work begins and ends (the GPU check's idle-share timer), and the decode
graphs' one shared logits buffer: on CPU, eager and through the graph replay path."""

from __future__ import annotations

import pytest
import torch

from runtime.execution.forward_batch import ForwardEntry
from tests.runtime.execution.tiny_runner import SHAPES, make_runner, write_config


class Marks:
    def __init__(self, log: list[str]) -> None:
        self.log = log

    def device_work_begins(self) -> None:
        self.log.append("begins")

    def device_work_ends(self) -> None:
        self.log.append("ends")


def _runner_with_log(tmp_path, monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    runner = make_runner(write_config(tmp_path / "m", *SHAPES["smollm2"]), page_size=1)
    log: list[str] = []
    for name in ("plan", "plan_cuda_graph"):
        original = getattr(runner.backend, name)

        def logged(*args, _original=original, _name=name):  # type: ignore[no-untyped-def]
            log.append(_name)
            return _original(*args)

        monkeypatch.setattr(runner.backend, name, logged)
    model_forward = runner.model.forward

    def logged_model(*args):  # type: ignore[no-untyped-def]
        log.append("model")
        return model_forward(*args)

    monkeypatch.setattr(runner.model, "forward", logged_model)
    runner.step_marks = Marks(log)
    return runner, log


def _prefill_and_decodes(runner, n: int) -> list[ForwardEntry]:  # type: ignore[no-untyped-def]
    decodes = []
    for row in range(n):
        base = 16 * (row + 1)
        runner.forward([ForwardEntry(row=row, input_ids=[3, 4, 5], prefix_len=0, kv_write=[base, base + 1, base + 2],
                                     kv_write_start=0)])
        decodes.append(ForwardEntry(row=row, input_ids=[6], prefix_len=3, kv_write=[base + 3], kv_write_start=3))
    return decodes


def test_device_work_begins_after_the_plan_and_ends_after_sampling(tmp_path, monkeypatch) -> None:
    runner, log = _runner_with_log(tmp_path, monkeypatch)
    decodes = _prefill_and_decodes(runner, 3)
    log.clear()
    runner.forward(decodes)
    assert log == ["plan", "begins", "model", "ends"]  # host preparation is not counted as GPU work


def test_graph_steps_mark_around_the_replay_and_share_one_logits_buffer(tmp_path, monkeypatch) -> None:
    runner, log = _runner_with_log(tmp_path, monkeypatch)
    decodes = _prefill_and_decodes(runner, 3)
    runner.init_cuda_graphs(8, capture=False)
    graphs = runner.graphs
    assert graphs is not None and graphs.sizes == [1, 2, 4, 8]
    assert graphs.logits.shape == (8, runner.vocab_size) and not hasattr(graphs, "outputs")
    log.clear()
    kept = runner.forward(decodes, keep_logits=True)  # 3 rows, replayed in the bucket of 4
    # (the torch backend's plan_cuda_graph plans through plan; the stand-in replay reruns the model)
    assert log[0] == "plan_cuda_graph" and log[-3:] == ["begins", "model", "ends"], log
    assert kept.last_logits is not None
    assert kept.last_logits.data_ptr() != graphs.logits.data_ptr()  # handed out: a copy
    torch.testing.assert_close(kept.last_logits, graphs.logits[:3])
    one = runner.forward(decodes[:1], keep_logits=True)  # the bucket of 1 writes the same buffer's first row
    torch.testing.assert_close(one.last_logits, graphs.logits[:1])
