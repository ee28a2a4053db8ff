"""Helpers every child process (scheduler, detokenizer) runs first.

    configure_child(config, "detokenizer")   process title, logging, SIGINT/SIGTERM ignored
    watch_parent()                           exit as soon as the launching process dies

The parent-death watch uses the sentinel multiprocessing gives a spawned child: a pipe whose
write end the parent holds until it exits, so its EOF arrives the moment the parent dies (even
by SIGKILL). Without one (a child not started by multiprocessing) it polls `os.getppid()`.
"""

from __future__ import annotations

import logging
import multiprocessing
import multiprocessing.connection
import os
import signal
import threading

from runtime.contracts.config import ServerConfig

logger = logging.getLogger("radixserve.procutil")

PARENT_POLL_S = 0.5
PARENT_DIED_EXIT_CODE = 1


def configure_child(config: ServerConfig, name: str) -> None:
    """Set the process title (when setproctitle is installed), logging and signal handling.

    SIGINT and SIGTERM are ignored: Ctrl-C in a terminal, or a SIGTERM sent to the process group
    (timeout, systemd), reaches every process, and the parent,
    which owns the shutdown, stops the children with a ShutdownReq (or by dying).
    """
    try:
        import setproctitle

        setproctitle.setproctitle(f"radixserve::{name}")
    except ImportError:
        pass
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    configure_logging(config.log_level, name)


def configure_logging(level: str, process_name: str) -> None:
    """Root logging for one process, every line tagged with the process name."""
    fmt = f"[%(asctime)s {process_name}] %(levelname)s %(name)s: %(message)s"
    logging.basicConfig(level=level.upper(), format=fmt, force=True)


def watch_parent() -> threading.Thread:
    """Start a daemon thread that exits this process (os._exit) when its parent dies."""
    parent = multiprocessing.parent_process()
    target = _wait_sentinel if parent is not None and parent.sentinel is not None else _poll_ppid
    thread = threading.Thread(target=target, args=(parent,), name="parent-watch", daemon=True)
    thread.start()
    return thread


def _wait_sentinel(parent: multiprocessing.process.BaseProcess) -> None:
    multiprocessing.connection.wait([parent.sentinel])
    _exit_orphan()


def _poll_ppid(_: object) -> None:
    ppid = os.getppid()
    while os.getppid() == ppid:
        threading.Event().wait(PARENT_POLL_S)
    _exit_orphan()


def _exit_orphan() -> None:
    logger.error("the parent process died; exiting")
    logging.shutdown()
    os._exit(PARENT_DIED_EXIT_CODE)
