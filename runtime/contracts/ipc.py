"""ZMQ PUSH/PULL sockets carrying `runtime.contracts.messages` over `ipc://` paths in a private directory.

The only module that imports zmq. Wiring (docs/architecture.md, "The processes"): the *receiving* side binds, senders
connect, so a sender may start before its receiver (ZMQ queues and reconnects).

    main process   PULL bind  "tokenizer"    <- detokenizer PUSH, scheduler PUSH (control replies)
    scheduler      PULL bind  "scheduler"    <- main process PUSH, launcher PUSH (ShutdownReq)
    detokenizer    PULL bind  "detokenizer"  <- scheduler PUSH

High-water marks are finite (HWM messages queued per socket, on each side), so a receiver that
falls behind makes its sender wait instead of growing memory without bound: `send` queues at
once while there is room, else waits up to `send_timeout_ms` for the receiver to read, and then
raises ConnectionError (the sender treats that as its peer being stuck). Nothing is ever dropped.
The main process's sends to the scheduler stay far below the mark: admission control bounds the
requests, and so the messages, in flight.
"""

from __future__ import annotations

import atexit
import os
import re
import shutil
import stat
import tempfile
from typing import Any

import zmq
import zmq.asyncio

from runtime.contracts.codec import decode, encode

_NAME = re.compile(r"[A-Za-z0-9_.-]+")
_MAX_IPC_PATH = 107  # sockaddr_un.sun_path is 108 bytes on Linux, NUL included
DEFAULT_LINGER_MS = 1000
HWM = 10_000  # messages (one is a whole batch's output)
SEND_TIMEOUT_MS = 60_000  # how long a sender waits for a receiver that is HWM messages behind


class IpcDir:
    """A private per-launch directory (mode 0700) holding the `ipc://` socket files.

    `IpcDir()` creates a fresh one, owned by this process: `cleanup()` (also run at exit and on
    leaving a `with` block) removes it. `IpcDir(path)` refers to an existing one, e.g. in a child
    given `ipc_dir.path` by the launcher; it does not own it and `cleanup()` leaves it alone.
    """

    def __init__(self, path: str | None = None) -> None:
        if path is not None:
            self.path = path
            self._owner_pid: int | None = None
            return
        self.path = tempfile.mkdtemp(prefix="radixserve-")
        self._owner_pid = os.getpid()
        st = os.stat(self.path)
        if stat.S_IMODE(st.st_mode) != 0o700 or st.st_uid != os.getuid():
            self.cleanup()
            raise RuntimeError(f"IPC directory {self.path} is not private (mode 0700, owned by us)")
        atexit.register(self.cleanup)

    def endpoint(self, name: str) -> str:
        """`ipc://<dir>/<name>`; `name` is a plain file name such as "scheduler"."""
        if not _NAME.fullmatch(name):
            raise ValueError(f"IPC endpoint name must match {_NAME.pattern}, got {name!r}")
        path = os.path.join(self.path, name)
        if len(os.fsencode(path)) > _MAX_IPC_PATH:
            msg = f"IPC path {path!r} is longer than {_MAX_IPC_PATH} bytes; use a shorter TMPDIR"
            raise ValueError(msg)
        return "ipc://" + path

    def cleanup(self) -> None:
        """Remove the directory and its socket files (owner only; safe to call twice)."""
        # NOTE: the pid check keeps a forked child from deleting its parent's sockets at exit.
        if self._owner_pid == os.getpid():
            shutil.rmtree(self.path, ignore_errors=True)

    def __enter__(self) -> IpcDir:
        return self

    def __exit__(self, *exc: object) -> None:
        self.cleanup()


def new_context() -> zmq.Context[Any]:
    """A ZMQ context for this process (one per process; close its sockets, then `term()` it)."""
    return zmq.Context()


def _socket(ctx: zmq.Context[Any], kind: int, endpoint: str, bind: bool, linger_ms: int, hwm: int = HWM) -> Any:
    sock = ctx.socket(kind)
    sock.setsockopt(zmq.SNDHWM, hwm)
    sock.setsockopt(zmq.RCVHWM, hwm)
    sock.setsockopt(zmq.LINGER, linger_ms)
    try:
        if bind:
            sock.bind(endpoint)
        else:
            sock.connect(endpoint)
    except zmq.ZMQError:
        sock.close(linger=0)
        raise
    return sock


class PushSocket:
    """Send messages to one endpoint.

    `linger_ms` bounds how long `close()` (and the context's `term()`) waits to deliver messages
    still queued: a bounded wait, never forever, so a final message such as `SchedulerCrashed`
    sent just before exit still gets out. Pass 0 to drop queued messages at once.
    """

    def __init__(self, ctx: zmq.Context[Any], endpoint: str, bind: bool = False,
                 linger_ms: int = DEFAULT_LINGER_MS, hwm: int = HWM, send_timeout_ms: int = SEND_TIMEOUT_MS) -> None:
        self.endpoint = endpoint
        self.send_timeout_ms = send_timeout_ms
        self._sock = _socket(ctx, zmq.PUSH, endpoint, bind, linger_ms, hwm)

    def send(self, msg: Any) -> None:
        """Encode and queue `msg`: at once while the queue has room, else after waiting up to
        `send_timeout_ms` for the receiver to read.

        Raises:
            ConnectionError: the receiver stayed HWM messages behind for the whole wait (or, on a
                bound PUSH, no peer is connected).
        """
        data = encode(msg)
        try:
            self._sock.send(data, zmq.NOBLOCK)
            return
        except zmq.Again:
            pass
        if self._sock.poll(self.send_timeout_ms, zmq.POLLOUT):
            self._sock.send(data, zmq.NOBLOCK)
            return
        raise ConnectionError(f"the receiver of {self.endpoint} is {HWM}+ messages behind and read "
                              f"nothing for {self.send_timeout_ms / 1000:g} s")

    def close(self) -> None:
        self._sock.close()


class PullSocket:
    """Receive messages from one endpoint (usually bound: the receiver binds)."""

    def __init__(self, ctx: zmq.Context[Any], endpoint: str, bind: bool = True, hwm: int = HWM) -> None:
        self.endpoint = endpoint
        self._sock = _socket(ctx, zmq.PULL, endpoint, bind, 0, hwm)

    def recv(self, timeout_ms: int | None = None) -> Any | None:
        """The next message; None if none arrives within `timeout_ms` (None waits forever)."""
        if timeout_ms is not None and not self._sock.poll(timeout_ms, zmq.POLLIN):
            return None
        return decode(self._sock.recv())

    def drain(self) -> list[Any]:
        """Every message queued right now, in arrival order, without waiting."""
        out: list[Any] = []
        while True:
            try:
                data = self._sock.recv(zmq.NOBLOCK)
            except zmq.Again:
                return out
            out.append(decode(data))

    def close(self) -> None:
        self._sock.close()


class AsyncPullSocket:
    """`PullSocket` for an asyncio loop (the main process): `msg = await sock.recv()`.

    `ctx` may be a plain context from `new_context()`; it is shadowed as an asyncio context, so a
    process needs only one.
    """

    def __init__(self, ctx: zmq.Context[Any], endpoint: str, bind: bool = True) -> None:
        self.endpoint = endpoint
        actx = ctx if isinstance(ctx, zmq.asyncio.Context) else zmq.asyncio.Context.shadow(ctx)
        self._sock = _socket(actx, zmq.PULL, endpoint, bind, 0)

    async def recv(self) -> Any:
        """Wait for the next message (cancellable, e.g. with `asyncio.wait_for`)."""
        return decode(await self._sock.recv())

    def drain(self) -> list[Any]:
        """Every message queued right now, in arrival order, without waiting."""
        out: list[Any] = []
        while True:
            try:
                data = self._sock.recv(zmq.NOBLOCK).result()
            except zmq.Again:
                return out
            out.append(decode(data))

    def close(self) -> None:
        self._sock.close()
