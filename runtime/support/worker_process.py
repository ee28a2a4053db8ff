"""A helper process that answers requests one at a time and is killed when an answer is late.

For work that cannot be interrupted from Python and is sometimes unbounded in practice (xgrammar
building or compiling a pathological grammar): a thread would keep pinning a core after its
caller gave up, and every later request would queue behind it. The work runs in a spawned
process instead; an answer later than its timeout kills the process (the next request starts a
fresh one), and a crash of the work (a segfault in C++) kills only the helper.

    worker = KillableWorker(main, setup, name="grammar-compile")
    reply = worker.ask(request, timeout_s=10)   # TimeoutError: killed; EOFError: it crashed

`main(conn, setup)` is a picklable module-level function run in the child: it prepares (imports,
state from `setup`), sends "ready", then answers each `conn.recv()` with one `conn.send()` until
the pipe closes. `serve` is that loop for a plain handler.
"""

from __future__ import annotations

import multiprocessing
import signal
import threading
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

READY = "ready"
DEFAULT_START_TIMEOUT_S = 60.0  # a child importing torch and xgrammar: 2-4 s, longer under load


def serve(conn: Connection, handle: Callable[[Any], Any]) -> None:
    """The child's loop: report ready, then answer every request with `handle(request)`.

    The parent owns shutdown: it closes the pipe (EOF ends the loop), dies (the parent watch
    exits us), or terminates us at exit (multiprocessing SIGTERMs daemon children then joins
    them, so SIGTERM must have its default action: set here, because a parent that ignores it,
    as our scheduler does, passes SIG_IGN on through exec). Ctrl-C is the parent's.
    """
    from runtime.support.procutil import watch_parent

    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    watch_parent()
    conn.send(READY)
    while True:
        try:
            request = conn.recv()
        except (EOFError, OSError):
            return
        conn.send(handle(request))


class KillableWorker:
    """One helper process, started on demand, killed on a late answer. Callers serialize their
    `ask`s (one request is in the helper at a time); `kill()` may come from any thread (a
    shutdown while an `ask` waits: the waiting `ask` then raises EOFError)."""

    def __init__(self, main: Callable[[Connection, Any], None], setup: Any, name: str,
                 start_timeout_s: float = DEFAULT_START_TIMEOUT_S) -> None:
        self.main = main
        self.setup = setup
        self.name = name
        self.start_timeout_s = start_timeout_s
        self.proc: multiprocessing.process.BaseProcess | None = None
        self.conn: Connection | None = None
        self._lock = threading.Lock()  # guards proc/conn: kill() races a waiting ask()

    def ask(self, request: Any, timeout_s: float) -> Any:
        """The helper's answer to `request`.

        Raises:
            TimeoutError: no answer within `timeout_s` (the helper was killed).
            EOFError: the helper died on this request.
            RuntimeError: the helper could not start.
        """
        conn = self.ensure_started()
        try:
            conn.send(request)
        except OSError:  # it died while idle: start a fresh one, once
            self.kill()
            conn = self.ensure_started()
            conn.send(request)
        try:
            answered = conn.poll(timeout_s)
            reply = conn.recv() if answered else None
        except (EOFError, OSError):  # it died, or another thread killed it (closing our pipe)
            self.kill()
            raise EOFError from None
        if not answered:
            self.kill()
            raise TimeoutError
        return reply

    def ensure_started(self) -> Connection:
        if self.conn is not None and self.proc is not None and self.proc.is_alive():
            return self.conn
        self.kill()
        ctx = multiprocessing.get_context("spawn")
        parent, child = ctx.Pipe()
        proc = ctx.Process(target=self.main, args=(child, self.setup), name=self.name, daemon=True)
        proc.start()
        child.close()
        with self._lock:
            self.proc, self.conn = proc, parent
        try:
            ready = parent.poll(self.start_timeout_s) and parent.recv() == READY
        except (EOFError, OSError):  # it exited during start-up (e.g. a missing module)
            ready = False
        if not ready:
            self.kill()
            raise RuntimeError(f"the {self.name} worker did not start")
        return parent

    def kill(self) -> None:
        """Kill the helper and close the pipe; idempotent, and each is done by one caller only
        (two threads closing one pipe would close its fd twice)."""
        with self._lock:
            proc, conn = self.proc, self.conn
            self.proc, self.conn = None, None
        if proc is not None:
            proc.kill()
            proc.join(timeout=5.0)
        if conn is not None:
            conn.close()
