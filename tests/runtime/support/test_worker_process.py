"""The killable helper process: answers, a late answer kills it, a crash is reported, and it
stops when its parent's multiprocessing terminates it even under a parent that ignores SIGTERM."""

from __future__ import annotations

import signal
import sys
import threading
import time
from pathlib import Path

import pytest

from runtime.support.worker_process import KillableWorker
from tests.runtime.support.worker_mains import echo_or_sleep, mark_then_sleep


def test_answers_then_a_late_answer_kills_it_and_the_next_request_gets_a_fresh_one() -> None:
    worker = KillableWorker(echo_or_sleep, "setup", "test-helper")
    try:
        assert worker.ask("hi", timeout_s=60) == ("setup", "hi")
        first = worker.proc
        with pytest.raises(TimeoutError):
            worker.ask("sleep", timeout_s=0.5)
        assert worker.proc is None and first is not None and not first.is_alive()
        assert worker.ask("again", timeout_s=60) == ("setup", "again")
        with pytest.raises(EOFError):
            worker.ask("crash", timeout_s=60)
        assert worker.ask("after", timeout_s=60) == ("setup", "after")
    finally:
        worker.kill()


def test_terminate_stops_it_although_the_parent_ignores_sigterm() -> None:
    """Our scheduler ignores SIGTERM, and SIG_IGN passes through exec to a spawned helper; the
    helper must restore the default, or multiprocessing's exit handler (terminate, then join)
    hangs the scheduler's exit (it was killed after 10 s, once per server stop)."""
    previous = signal.signal(signal.SIGTERM, signal.SIG_IGN)
    worker = KillableWorker(echo_or_sleep, None, "test-helper")
    try:
        worker.ensure_started()
    finally:
        signal.signal(signal.SIGTERM, previous)
    proc = worker.proc
    assert proc is not None
    proc.terminate()
    proc.join(timeout=10)
    assert proc.exitcode == -signal.SIGTERM
    worker.kill()


def test_a_kill_from_another_thread_ends_a_waiting_ask_with_eof(tmp_path: Path) -> None:
    """A shutdown while a request waits: the waiting ask raises EOFError, and the pipe is
    closed once (two closes of one fd raised EBADF, or closed someone else's fd). The kill
    comes once the helper holds the request and the asking thread waits for the answer."""
    marker = tmp_path / "in-helper"
    worker = KillableWorker(mark_then_sleep, str(marker), "test-helper")
    worker.ensure_started()
    outcome: list[BaseException] = []

    def ask() -> None:
        try:
            worker.ask("sleep", timeout_s=120)
        except BaseException as exc:  # noqa: BLE001 - the test inspects it
            outcome.append(exc)

    waiter = threading.Thread(target=ask, daemon=True)
    waiter.start()
    deadline = time.monotonic() + 60  # bounds a failure only
    while not (marker.exists() and _waits_in_poll(waiter)):
        assert time.monotonic() < deadline and waiter.is_alive(), "the ask never reached the helper"
        time.sleep(0.01)
    for _ in range(3):
        worker.kill()  # idempotent
    waiter.join(timeout=30)
    assert not waiter.is_alive() and len(outcome) == 1 and isinstance(outcome[0], EOFError), outcome


def _waits_in_poll(thread: threading.Thread) -> bool:
    """Whether `thread` is inside `Connection.poll` (KillableWorker.ask waiting for the answer)."""
    frame = sys._current_frames().get(thread.ident or -1)
    while frame is not None:
        if frame.f_code.co_name == "poll" and "multiprocessing" in frame.f_code.co_filename:
            return True
        frame = frame.f_back
    return False
