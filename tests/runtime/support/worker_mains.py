"""Helper-process mains for tests/runtime/support/test_worker_process.py (spawned: module level)."""

from __future__ import annotations

import time
from multiprocessing.connection import Connection
from typing import Any

from runtime.support.worker_process import serve


def echo_or_sleep(conn: Connection, setup: Any) -> None:
    """Answers (setup, request); a request "sleep" never finishes in time, "crash" kills the helper."""

    def handle(request: Any) -> Any:
        if request == "sleep":
            time.sleep(3600)
        if request == "crash":
            import os

            os._exit(7)
        return setup, request

    serve(conn, handle)


def mark_then_sleep(conn: Connection, marker: str) -> None:
    """On "sleep": creates the file `marker` (the request is in the helper), then never answers."""

    def handle(request: Any) -> Any:
        if request == "sleep":
            open(marker, "w").close()
            time.sleep(3600)
        return request

    serve(conn, handle)
