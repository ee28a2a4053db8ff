"""The HTTP server's shared state: its phase, the TokenizerManager once ready, the in-flight count,
and the two background duties of a running server (drain on shutdown, the periodic log line).

    STARTING ──runtime up──▶ READY ──SIGTERM/SIGINT──▶ DRAINING ──▶ STOPPED
                               └──────child died─────▶ DEAD

Only READY accepts new generations; /health is 200 only then. Other routes that need the runtime
answer 503 while STARTING, and `RuntimeCrashed` (-> 503) once DEAD.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import os
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from runtime.contracts.config import ServerConfig
from runtime.contracts.errors import RuntimeCrashed
from tokenizer.errors import HTTPError
from tokenizer.metrics import ServerMetrics, kv_usage

if TYPE_CHECKING:
    from tokenizer.manager import TokenizerManager

logger = logging.getLogger("radixserve.server")

LOG_INTERVAL_S = 10.0
STATE_TIMEOUT_S = 5.0


class Phase(enum.Enum):
    STARTING = "starting"
    READY = "ready"
    DRAINING = "draining"
    STOPPED = "stopped"
    DEAD = "dead"


def served_model_name(config: ServerConfig) -> str:
    """`--served-model-name`, or the model folder's name."""
    if config.served_model_name:
        return config.served_model_name
    return os.path.basename((config.model_path or "model").rstrip("/")) or "model"


class ServerState:
    """What every route needs. One per app; lives on the server's event loop."""

    def __init__(self, config: ServerConfig) -> None:
        self.config = config
        self.model_name = served_model_name(config)
        self.metrics = ServerMetrics(self.model_name, config.metrics_prefix)
        self.created = int(time.time())
        self.phase = Phase.STARTING
        self.tm: TokenizerManager | None = None
        self.inflight = 0
        self.dead_reason: str | None = None
        self._idle = asyncio.Event()
        self._idle.set()

    def attach(self, tm: TokenizerManager) -> None:
        """The runtime is up: serve with this manager."""
        self.tm = tm
        tm.on_output = self.metrics.observe_output
        tm.on_reject = self.metrics.observe_reject
        self.phase = Phase.READY

    @property
    def healthy(self) -> bool:
        return self.phase is Phase.READY and self.tm is not None and self.tm.is_healthy

    def manager(self) -> TokenizerManager:
        """The manager, for routes that need the runtime (503 while starting, after a crash)."""
        if self.tm is None:
            if self.dead_reason is not None:
                raise RuntimeCrashed(self.dead_reason)
            raise HTTPError(503, "The server is starting; retry when /health returns 200.")
        if self.tm.dead_reason is not None:
            raise RuntimeCrashed(self.tm.dead_reason)
        return self.tm

    def accepting_manager(self) -> TokenizerManager:
        """The manager, for routes that start a generation (also 503 while draining)."""
        tm = self.manager()
        if self.phase is not Phase.READY:
            raise HTTPError(503, f"The server is {self.phase.value}; it accepts no new requests.")
        return tm

    @contextlib.contextmanager
    def track(self) -> Iterator[None]:
        """Count one in-flight generation (the drain waits for the count to reach zero)."""
        self.inflight += 1
        self._idle.clear()
        try:
            yield
        finally:
            self.inflight -= 1
            if self.inflight == 0:
                self._idle.set()

    async def drain(self, timeout: float) -> bool:
        """Stop accepting, then wait up to `timeout` s for in-flight requests; True if all ended."""
        if self.phase is Phase.READY:
            self.phase = Phase.DRAINING
        logger.info("draining: %d request(s) in flight, waiting up to %.0f s",
                    self.inflight, timeout)
        try:
            await asyncio.wait_for(self._idle.wait(), timeout)
            return True
        except TimeoutError:
            logger.warning("drain timed out with %d request(s) in flight; aborting them",
                           self.inflight)
            return False

    async def refresh_gauges(self) -> dict[str, Any] | None:
        """Ask the scheduler for its state and update the gauges; None if it cannot answer."""
        if self.tm is None or not self.tm.is_healthy:
            return None
        try:
            state = await asyncio.wait_for(self.tm.get_state(), STATE_TIMEOUT_S)
        except (TimeoutError, RuntimeCrashed):
            return None
        self.metrics.update_state(state)
        return state

    async def log_periodically(self, interval: float = LOG_INTERVAL_S) -> None:
        """One line every `interval` s while there is work (no prompt text, ever)."""
        while True:
            await asyncio.sleep(interval)
            window = self.metrics.tick()
            if self.tm is not None:
                self.metrics.prune(self.tm.rid_to_state)
            if self.inflight == 0 and window.generation_tokens == 0:
                continue
            state = await self.refresh_gauges()
            if state is None:
                continue
            logger.info(
                "running %s, queued %s, in flight (HTTP) %d, generation %.1f tok/s, "
                "cache hit rate %.1f%%, KV usage %.1f%%",
                state.get("running"), state.get("waiting"), self.inflight,
                window.gen_throughput, 100 * window.cache_hit_rate,
                100 * kv_usage(state),
            )
