"""Plan staging: successive plans alternate between two buffers, and a plan waits for the copy that
last read its buffer (FlashInfer's unfenced plan() copy), never for the one just queued."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from kernels.flashinfer_staging import STAGING_ATTR, PlanStaging


class FakeCopyEvent:
    """Stands for a CUDA event after a plan's queued copy: done once the 'GPU' has run it."""

    log: list[str] = []

    def __init__(self) -> None:
        self.done = False
        self.name = f"copy{len([e for e in self.log if e.startswith('record')])}"

    def record(self) -> None:
        self.log.append(f"record {self.name}")

    def query(self) -> bool:
        return self.done

    def synchronize(self) -> None:
        self.log.append(f"wait {self.name}" + ("" if self.done else " (blocked)"))
        self.done = True


def _wrapper() -> SimpleNamespace:
    return SimpleNamespace(**{STAGING_ATTR: torch.empty(1 << 10, dtype=torch.uint8)})


def test_plans_alternate_buffers_and_wait_for_the_copy_two_plans_back() -> None:
    FakeCopyEvent.log = []
    staging = PlanStaging(1 << 10, pin=False, new_event=FakeCopyEvent)
    prefill, decode = _wrapper(), _wrapper()
    staging.adopt(prefill)
    staging.adopt(decode)
    used = []
    for wrapper in (prefill, decode, decode, prefill):
        with staging.plan(wrapper):
            used.append(getattr(wrapper, STAGING_ATTR).data_ptr())
            FakeCopyEvent.log.append("plan")
    first, second = (b.data_ptr() for b in staging.buffers)
    assert used == [first, second, first, second]
    # Plan 3 reuses plan 1's buffer: it waits for plan 1's copy (still queued here: the GPU ran
    # nothing), never for plan 2's.
    assert FakeCopyEvent.log == ["plan", "record copy0", "plan", "record copy1",
                                 "wait copy0 (blocked)", "plan", "record copy2",
                                 "wait copy1 (blocked)", "plan", "record copy3"]
    assert staging.waits == 2


def test_a_finished_copy_is_not_counted_as_a_wait() -> None:
    FakeCopyEvent.log = []
    staging = PlanStaging(1 << 10, pin=False, new_event=FakeCopyEvent)
    wrapper = _wrapper()
    for _ in range(2):
        with staging.plan(wrapper):
            pass
    for event in staging.copied:
        assert event is not None
        event.done = True  # the GPU caught up
    with staging.plan(wrapper):
        pass
    assert staging.waits == 0


def test_wrappers_share_the_pair_and_give_up_their_own() -> None:
    staging = PlanStaging(1 << 10, pin=False, new_event=None)
    wrappers = [_wrapper() for _ in range(5)]
    for w in wrappers:
        staging.adopt(w)
    assert {getattr(w, STAGING_ATTR).data_ptr() for w in wrappers} <= {b.data_ptr() for b in staging.buffers}
    with pytest.raises(ValueError, match="more than the shared"):
        staging.adopt(SimpleNamespace(**{STAGING_ATTR: torch.empty(2 << 10, dtype=torch.uint8)}))


def test_cpu_staging_alternates_without_events() -> None:
    staging = PlanStaging.for_device(torch.device("cpu"), nbytes=64)
    wrapper = _wrapper()
    ptrs = []
    for _ in range(3):
        with staging.plan(wrapper):
            ptrs.append(getattr(wrapper, STAGING_ATTR).data_ptr())
    assert ptrs[0] == ptrs[2] != ptrs[1]
    assert staging.copied == [None, None]
