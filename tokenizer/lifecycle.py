"""The server process from start to exit (docs/architecture.md, "The processes").

1. Resolve the config and bind the HTTP port first (a busy port fails at once, and /health
   answers 503 "starting" while the model loads).
2. Launch the scheduler and detokenizer (in a worker thread: it blocks), loading this process's
   tokenizer while they load; create the TokenizerManager on this loop (uvloop), log one
   startup line, serve.
3. SIGTERM/SIGINT: drain (new generations get 503, in-flight ones get up to --drain-timeout s;
   a second signal stops at once), then stop the runtime (its IPC directory is removed): exit 0.
   A child that dies: every in-flight request fails (503 / a stream error event), /health turns
   503, everything stops: exit 1.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import signal
from collections.abc import Callable

from aiohttp import web

from runtime.contracts.config import ServerConfig
from runtime.contracts.errors import InvalidRequest
from runtime.support.procutil import configure_logging
from tokenizer.launch import LaunchError, Runtime, launch_runtime_with
from tokenizer.server_state import Phase, ServerState

logger = logging.getLogger("radixserve.server")


class Http2ProbeFilter(logging.Filter):
    """Drops aiohttp's error record (with a traceback) for a connection that opens with the
    HTTP/2 preface "PRI * HTTP/2.0": sglang-router probes every worker for gRPC that way before
    it speaks HTTP/1.1, a few times per worker at its start. The client still gets its 400, and
    every other malformed request is still logged."""

    def filter(self, record: logging.LogRecord) -> bool:
        from aiohttp.http_exceptions import BadHttpMessage

        exc = record.exc_info[1] if record.exc_info else None
        return not (isinstance(exc, BadHttpMessage) and "PRI/Upgrade" in str(exc))

HANDLER_GRACE_S = 5.0  # after the drain: how long handlers get to send their last bytes
AppFactory = Callable[[ServerState], web.Application]


def run(config: ServerConfig, app_factory: AppFactory) -> int:
    """Serve until stopped; returns the process exit code."""
    from runtime.execution.resolve import resolve_config

    configure_logging(config.log_level, "server")
    try:
        config = resolve_config(config)
    except (InvalidRequest, OSError, ValueError) as exc:
        logger.error("invalid configuration: %s", exc)
        return 2
    with asyncio.Runner(loop_factory=_loop_factory()) as runner:
        return runner.run(ServerProcess(config, app_factory).run())


class ServerProcess:
    """One serving run: HTTP site, runtime, TokenizerManager, signals and the exit code."""

    def __init__(self, config: ServerConfig, app_factory: AppFactory) -> None:
        self.config = config
        self.server = ServerState(config)
        self.app_factory = app_factory
        self.runtime: Runtime | None = None
        self.exit_code = 0
        self._stop = asyncio.Event()
        self._force = asyncio.Event()
        self._signals = 0

    async def run(self) -> int:
        debug = self.config.log_level == "debug"
        logging.getLogger("aiohttp.server").addFilter(Http2ProbeFilter())
        runner = web.AppRunner(
            self.app_factory(self.server), handler_cancellation=True,
            access_log=logging.getLogger("aiohttp.access") if debug else None,
            shutdown_timeout=HANDLER_GRACE_S)
        await runner.setup()
        try:
            await web.TCPSite(runner, self.config.host, self.config.port).start()
        except OSError as exc:
            logger.error("cannot listen on %s:%d: %s", self.config.host, self.config.port, exc)
            await runner.cleanup()
            return 1
        self._install_signals()
        log_task: asyncio.Task[None] | None = None
        try:
            if await self._start_runtime():
                log_task = asyncio.create_task(self.server.log_periodically(), name="server-log")
                await self._stop.wait()
                if self.server.phase is Phase.READY:
                    await self._drain()
        finally:
            if log_task is not None:
                log_task.cancel()
            await self._shutdown(runner)
        return self.exit_code

    # ------------------------------------------------------------ start

    async def _start_runtime(self) -> bool:
        from runtime.support.tokenizer_load import load_tokenizer, tokenizer_source
        from tokenizer.manager import TokenizerManager

        loop = asyncio.get_running_loop()
        load = functools.partial(load_tokenizer, tokenizer_source(self.config))
        try:
            # NOTE: in a worker thread: launching blocks (this tokenizer loads while the children
            # do), and /health must keep answering meanwhile.
            runtime, tokenizer = await loop.run_in_executor(None, launch_runtime_with, self.config, load)
        except LaunchError as exc:
            logger.error("the runtime failed to start: %s", exc)
            self.exit_code = 1
            return False
        self.runtime = runtime
        if self._stop.is_set():
            return False  # stopped while loading
        tm = TokenizerManager(self.config, runtime.ipc_path, runtime.scheduler_info, tokenizer)
        tm.on_dead = self._on_dead
        await tm.start()
        runtime.watch(tm.fail_all_threadsafe)
        self.server.attach(tm)
        self._log_ready(runtime.scheduler_info)
        return True

    def _log_ready(self, info: dict[str, object]) -> None:
        c = self.config
        logger.info(
            "radixserve ready at http://%s:%d | model %s (%s) | device %s, %s | KV capacity %s "
            "tokens | max running %s | context %s",
            c.host, c.port, self.server.model_name, c.model_path, c.device, c.dtype,
            info.get("max_total_tokens"), info.get("max_running_requests"),
            info.get("context_length"))

    # ------------------------------------------------------------ stop

    def _install_signals(self) -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._on_signal, sig)

    def _on_signal(self, sig: signal.Signals) -> None:
        self._signals += 1
        if self._signals == 1:
            logger.info("%s received: stopping (a second signal stops without draining)", sig.name)
            self._stop.set()
        else:
            logger.warning("%s received again: stopping now", sig.name)
            self._force.set()

    def _on_dead(self, message: str) -> None:
        """The TokenizerManager failed (a child died or crashed): stop with a non-zero exit."""
        self.server.phase, self.server.dead_reason = Phase.DEAD, message
        self.exit_code = 1
        self._stop.set()

    async def _drain(self) -> None:
        drain = asyncio.create_task(self.server.drain(self.server.config.drain_timeout))
        force = asyncio.create_task(self._force.wait())
        await asyncio.wait({drain, force}, return_when=asyncio.FIRST_COMPLETED)
        for task in (drain, force):
            task.cancel()

    async def _shutdown(self, runner: web.AppRunner) -> None:
        """Fail what is left, let handlers answer, close the site, stop the children."""
        if self.server.phase is not Phase.DEAD:
            self.server.phase = Phase.STOPPED
        tm = self.server.tm
        if tm is not None:
            tm.on_dead = None  # NOTE: closing fails leftovers; that is not a crash
            await tm.close()
        await runner.cleanup()
        if self.runtime is not None:
            await asyncio.get_running_loop().run_in_executor(None, self.runtime.shutdown)
        logger.info("server stopped (exit code %d)", self.exit_code)


def _loop_factory() -> Callable[[], asyncio.AbstractEventLoop]:
    try:
        import uvloop
    except ImportError:
        return asyncio.new_event_loop
    return uvloop.new_event_loop
