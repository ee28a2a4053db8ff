"""The watchdog's rule and thread (the process-level case is tests/tokenizer/test_launch.py)."""

from __future__ import annotations

import threading
import time

from scheduler.watchdog import WATCHDOG_EXIT_CODE, Watchdog, stalled_for, thread_stacks


def test_stalled_only_past_the_timeout() -> None:
    assert stalled_for(100.0, 104.0, 5.0) is None
    assert stalled_for(100.0, 106.0, 5.0) == 6.0


def test_a_stuck_loop_is_reported_with_stacks_then_the_process_exits() -> None:
    reports: list[str] = []
    exited = threading.Event()
    codes: list[int] = []
    stuck_since = time.monotonic()
    dog = Watchdog(0.2, lambda: stuck_since, reports.append, lambda code: (codes.append(code), exited.set()))
    dog.start()
    assert exited.wait(10)
    assert codes == [WATCHDOG_EXIT_CODE]
    assert reports[0].splitlines()[-1].startswith("WatchdogTimeout: the scheduler made no progress")
    assert "thread MainThread" in reports[0]


def test_a_loop_that_progresses_is_left_alone() -> None:
    codes: list[int] = []
    dog = Watchdog(0.2, time.monotonic, lambda m: None, codes.append).start()
    time.sleep(0.5)
    dog.stop()
    assert codes == []
    assert "thread" in thread_stacks()
