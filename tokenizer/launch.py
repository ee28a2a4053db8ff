"""Start the runtime's child processes, watch them, and shut them down.

    runtime = launch_runtime(resolved_config)      # scheduler + detokenizer, both ready
    runtime, tokenizer = launch_runtime_with(resolved_config, load)  # load() runs while they start
    runtime.watch(on_death)                        # on_death("the scheduler process exited ...")
    ...
    runtime.shutdown()                             # idempotent; also registered with atexit

The caller resolves the config first (`runtime.execution.resolve.resolve_config`, which imports torch),
so this module stays light and the caller holds the same resolved config it serves with.

With tp_size > 1 the children also include one "tp-rank-N" process per further rank
(runtime/execution/tp_worker.py): no sockets, stopped by rank 0 rather than by a ShutdownReq, and watched
like the others, so a rank's death fails every request.

Start-up order: the scheduler (the long pole: torch, weights, warm-up) is spawned first; then the
launcher decides which tokenizer class the folder needs (`runtime.support.tokenizer_load.class_ref`) and
hands it to the detokenizer, which then loads its tokenizer without importing torch; the caller's
own work (the main process's tokenizer) runs while both load.

Readiness: each child sends `ChildReady` over its own one-way pipe. The launcher waits on every
pipe and every process sentinel at once, so a child that dies while loading fails the launch at
once with its exit code instead of waiting out the timeout.
"""

from __future__ import annotations

import atexit
import logging
import multiprocessing as mp
import multiprocessing.connection
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import Any, TypeVar

from runtime.contracts.codec import CodecError, decode
from runtime.contracts.config import ServerConfig
from runtime.contracts.ipc import IpcDir, PushSocket, new_context
from runtime.contracts.messages import ChildReady, SchedulerCrashed, ShutdownReq

logger = logging.getLogger("radixserve.launch")

READY_TIMEOUT_S = {"scheduler": 300.0, "detokenizer": 120.0}  # model loading can be slow
SHUTDOWN_JOIN_S = 10.0  # how long children get to exit after ShutdownReq
KILL_JOIN_S = 3.0
ChildTarget = Callable[[ServerConfig, str, Connection], None]
_T = TypeVar("_T")


class LaunchError(RuntimeError):
    """A child process failed to start (died, crashed or timed out before it was ready)."""


@dataclass(slots=True)
class _Child:
    name: str
    process: BaseProcess
    ready_conn: Connection | None  # the launcher's read end, until ChildReady arrives
    has_socket: bool = True  # reads ShutdownReq on its own socket (tensor-parallel followers do not)


class Runtime:
    """The running child processes of one launch, their IPC directory and the scheduler's info."""

    def __init__(self, config: ServerConfig, ipc_dir: IpcDir) -> None:
        self.config = config
        self.ipc_dir = ipc_dir
        self.children: list[_Child] = []
        self.processes: dict[str, BaseProcess] = {}
        self._socket_names: set[str] = set()
        self.scheduler_info: dict[str, Any] = {}
        self._lock = threading.Lock()
        self._closed = False
        self._stop_r, self._stop_w = os.pipe()  # wakes the watcher thread on shutdown
        self._watcher: threading.Thread | None = None
        atexit.register(self.shutdown)

    def add(self, child: _Child) -> None:
        """Own a spawned child: it is waited for, watched and stopped with the others."""
        self.children.append(child)
        self.processes[child.name] = child.process
        if child.has_socket:
            self._socket_names.add(child.name)

    @property
    def ipc_path(self) -> str:
        return self.ipc_dir.path

    def watch(self, on_death: Callable[[str], None]) -> None:
        """Call `on_death(message)` from a watcher thread when a child exits unexpectedly.

        Exits during `shutdown()` are expected and not reported.
        """
        assert self._watcher is None, "watch() was already called"
        self._watcher = threading.Thread(
            target=self._watch, args=(on_death,), name="runtime-watcher", daemon=True
        )
        self._watcher.start()

    def _watch(self, on_death: Callable[[str], None]) -> None:
        by_sentinel = {p.sentinel: (name, p) for name, p in self.processes.items()}
        ready = multiprocessing.connection.wait([self._stop_r, *by_sentinel])
        if self._closed or self._stop_r in ready:
            return
        name, process = by_sentinel[ready[0]]  # type: ignore[index]
        process.join(timeout=1.0)
        message = f"the {name} process exited with code {process.exitcode}"
        logger.error(message)
        on_death(message)

    def shutdown(self, graceful: bool = True) -> None:
        """ShutdownReq to each child, join with a timeout, then terminate/kill stragglers, and
        remove the IPC directory. Idempotent and thread-safe; a second caller waits for the
        first to finish. `graceful=False` terminates at once (children that are still loading
        do not read their socket yet)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            os.write(self._stop_w, b"x")
            if self._watcher is not None and self._watcher is not threading.current_thread():
                self._watcher.join(timeout=2.0)
            if graceful:
                alive = [n for n, p in self.processes.items() if p.is_alive() and n in self._socket_names]
                _send_shutdown(self.ipc_dir, alive)
            _join_or_kill(list(self.processes.values()), SHUTDOWN_JOIN_S if graceful else 0.0)
            self.ipc_dir.cleanup()
            for fd in (self._stop_r, self._stop_w):
                os.close(fd)
            atexit.unregister(self.shutdown)
        logger.info("runtime stopped (exit codes %s)", self.exitcodes())

    def exitcodes(self) -> dict[str, int | None]:
        return {name: p.exitcode for name, p in self.processes.items()}


def launch_runtime(config: ServerConfig, scheduler_target: ChildTarget | None = None) -> Runtime:
    """Spawn the scheduler and detokenizer, wait until both are ready, return the `Runtime`.

    Args:
        config: a resolved config (`resolve_config`); it is pickled to the children.
        scheduler_target: the scheduler process entry (default
            `scheduler.process.run_scheduler_process`); tests pass a fake.
    Raises:
        LaunchError: a child died, crashed or timed out before it was ready (everything started
            is stopped and the IPC directory removed first).
    """
    return launch_runtime_with(config, lambda: None, scheduler_target)[0]


def launch_runtime_with(
    config: ServerConfig, meanwhile: Callable[[], _T], scheduler_target: ChildTarget | None = None
) -> tuple[Runtime, _T]:
    """`launch_runtime`, running `meanwhile()` in this thread while the children load.

    Returns the ready runtime and what `meanwhile()` returned.
    Raises:
        LaunchError: as `launch_runtime`, or `meanwhile()` raised (then it is the cause, and the
            children are stopped at once without waiting for them).
    """
    start = time.monotonic()
    runtime = _spawn_runtime(config, scheduler_target)
    try:
        try:
            result = meanwhile()
        except Exception as exc:
            raise LaunchError(
                f"the main process failed while the children loaded: {type(exc).__name__}: {exc}") from exc
        infos = _await_ready(runtime.children, start)
    except BaseException:
        runtime.shutdown(graceful=False)
        raise
    runtime.scheduler_info = infos["scheduler"]
    logger.info("runtime ready: %s", runtime.scheduler_info)
    return runtime, result


def _spawn_runtime(config: ServerConfig, scheduler_target: ChildTarget | None) -> Runtime:
    """Spawn every child, the model loaders first (see the module docstring); nothing waits for
    readiness. A failure stops what was spawned."""
    assert config.model_path and config.device != "auto", "resolve_config(config) first"
    if scheduler_target is None:
        from scheduler.process import run_scheduler_process

        scheduler_target = run_scheduler_process
    from detokenizer.manager import run_detokenizer_process
    from runtime.execution.tp_worker import rank_name, run_tp_rank_process

    ctx = mp.get_context("spawn")
    runtime = Runtime(config, IpcDir())
    path = runtime.ipc_path
    try:
        runtime.add(_spawn(ctx, "scheduler", scheduler_target, config, path))
        # Tensor-parallel ranks 1..: no sockets; they follow the scheduler (rank 0).
        for r in range(1, config.tp_size):
            runtime.add(_spawn(ctx, rank_name(r), run_tp_rank_process, config, path, r, has_socket=False))
        tokenizer_class = _tokenizer_class_ref(config)
        runtime.add(_spawn(ctx, "detokenizer", run_detokenizer_process, config, path, tokenizer_class))
    except BaseException:
        runtime.shutdown(graceful=False)
        raise
    return runtime


def _tokenizer_class_ref(config: ServerConfig) -> str | None:
    """The detokenizer's tokenizer class, or None to let it decide itself. NOTE: only a shortcut:
    any failure here is left for the detokenizer to meet and report as its own crash."""
    from runtime.support.tokenizer_load import class_ref, tokenizer_source

    try:
        return class_ref(tokenizer_source(config))
    except Exception:
        logger.debug("the tokenizer class is left to the detokenizer", exc_info=True)
        return None


def _spawn(
    ctx: Any, name: str, target: Callable[..., None], config: ServerConfig, ipc_path: str, *extra: Any,
    has_socket: bool = True,
) -> _Child:
    recv_end, send_end = ctx.Pipe(duplex=False)
    process = ctx.Process(
        target=target, args=(config, ipc_path, send_end, *extra), name=f"radixserve-{name}"
    )
    process.start()
    send_end.close()  # NOTE: the child holds the only write end, so its death reads as EOF
    return _Child(name, process, recv_end, has_socket)


def _await_ready(children: list[_Child], start: float) -> dict[str, dict[str, Any]]:
    """Wait for every ChildReady; fail fast on a death, a crash report or a timeout (each child's
    READY_TIMEOUT_S counts from `start`, its spawn)."""
    deadlines = {c.name: start + READY_TIMEOUT_S.get(c.name, 300.0) for c in children}
    infos: dict[str, dict[str, Any]] = {}
    while len(infos) < len(children):
        pending = [c for c in children if c.name not in infos]
        first = min(pending, key=lambda c: deadlines[c.name])
        waitables: list[Any] = [c.ready_conn for c in pending]
        waitables += [c.process.sentinel for c in pending]
        timeout = max(0.0, deadlines[first.name] - time.monotonic())
        ready = multiprocessing.connection.wait(waitables, timeout=timeout)
        if not ready:
            limit = READY_TIMEOUT_S.get(first.name, 300.0)
            raise LaunchError(f"the {first.name} process was not ready within {limit:.0f} s")
        for child in pending:
            if child.ready_conn in ready or child.process.sentinel in ready:
                infos[child.name] = _read_ready(child)
    return infos


def _read_ready(child: _Child) -> dict[str, Any]:
    assert child.ready_conn is not None
    try:
        msg = decode(child.ready_conn.recv_bytes()) if child.ready_conn.poll() else None
    except (EOFError, OSError, CodecError):
        msg = None
    child.ready_conn.close()
    child.ready_conn = None
    if isinstance(msg, ChildReady):
        return dict(msg.info)
    if isinstance(msg, SchedulerCrashed):
        raise LaunchError(f"the {child.name} process crashed while starting:\n{msg.traceback}")
    child.process.join(timeout=5.0)
    raise LaunchError(
        f"the {child.name} process exited with code {child.process.exitcode} before it was ready"
        " (see its log above)"
    )


def _send_shutdown(ipc_dir: IpcDir, names: list[str]) -> None:
    if not names:
        return
    ctx = new_context()
    try:
        for name in names:
            push = PushSocket(ctx, ipc_dir.endpoint(name), linger_ms=500)
            push.send(ShutdownReq())
            push.close()
    finally:
        ctx.term()


def _join_or_kill(processes: list[BaseProcess], grace_s: float) -> None:
    deadline = time.monotonic() + grace_s
    for p in processes:
        p.join(timeout=max(0.0, deadline - time.monotonic()))
    for p in processes:
        if p.is_alive():
            if grace_s > 0:
                logger.warning("%s did not exit after ShutdownReq; killing it", p.name)
            p.kill()  # children ignore SIGTERM (see procutil.configure_child)
            p.join(timeout=KILL_JOIN_S)

