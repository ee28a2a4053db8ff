"""The scheduler's watchdog: a thread that ends the process when the loop stops making progress.

Every loop iteration stamps `progress_at` (an idle scheduler iterates too: its socket wait times
out every 200 ms), so a stamp older than the timeout means one iteration is stuck: a forward that
never returns (a hung kernel, a deadlocked collective), or the loop itself. Nothing can unstick a
thread, so the watchdog reports (the stacks of every thread in the log and in the crash message),
lets the report leave, and exits the process with WATCHDOG_EXIT_CODE: the main process then fails
every in-flight request, turns /health to 503 and exits non-zero, for a supervisor to restart.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
import traceback
from collections.abc import Callable

logger = logging.getLogger("radixserve.scheduler")
WATCHDOG_EXIT_CODE = 3


def thread_stacks() -> str:
    """Every thread's current stack, the stuck one among them."""
    names = {t.ident: t.name for t in threading.enumerate()}
    parts = []
    for ident, frame in sys._current_frames().items():
        parts.append(f"thread {names.get(ident, ident)}:\n{''.join(traceback.format_stack(frame))}")
    return "\n".join(parts)


def stalled_for(progress_at: float, now: float, timeout_s: float) -> float | None:
    """Seconds without progress when that exceeds the timeout, else None."""
    stalled = now - progress_at
    return stalled if stalled > timeout_s else None


class Watchdog:
    def __init__(
        self,
        timeout_s: float,
        progress_at: Callable[[], float],
        report: Callable[[str], None],
        exit_process: Callable[[int], None] = os._exit,
    ) -> None:
        self.timeout_s = timeout_s
        self.progress_at = progress_at
        self.report = report
        self.exit_process = exit_process
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="watchdog", daemon=True)

    def start(self) -> Watchdog:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def _watch(self) -> None:
        interval = min(1.0, self.timeout_s / 4)
        while not self._stop.wait(interval):
            stalled = stalled_for(self.progress_at(), time.monotonic(), self.timeout_s)
            if stalled is None:
                continue
            # The summary comes last: the main process reports a crash by its last line.
            message = (f"{thread_stacks()}\nWatchdogTimeout: the scheduler made no progress for {stalled:.0f} s "
                       f"(--watchdog-timeout {self.timeout_s:g})")
            logger.error("watchdog: stacks of the stuck scheduler:\n%s", message)
            try:
                self.report(message)
            finally:
                self.exit_process(WATCHDOG_EXIT_CODE)
            return
