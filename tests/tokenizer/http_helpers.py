"""Start the real HTTP server as a subprocess for process tests, and small HTTP helpers.

    with RunningServer.start(model_path, "--api-key", "k") as server:
        requests.get(server.url + "/health")

The server runs `python -m tokenizer.http_server` on a free port with float32 weights, a small KV
pool and one torch thread (several torch threads fight over the few cores of a loaded CI machine
and get ~10x slower). Its output goes to a log file that a failing start prints.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import requests

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
START_TIMEOUT_S = 180.0
BASE_ARGS = ("--dtype", "float32", "--max-total-tokens", "8192", "--num-threads", "1",
             "--context-length", "2048")
# The flags of the run's shared servers beyond BASE_ARGS (tests/conftest.py says who uses which).
API_KEY = "test-key-123"  # key_server reads it from a file (--api-key-file)
AUTH = {"Authorization": f"Bearer {API_KEY}"}
KEY_SERVER_BODY_LIMIT = 65536  # bytes
KEY_SERVER_ARGS = ("--max-request-bytes", str(KEY_SERVER_BODY_LIMIT), "--max-running-requests", "2",
                   "--max-queued-requests", "1", "--max-prompts-per-request", "4")
SMALL_SERVER_DRAIN_S = 4  # seconds: ample for a few tokens, far short of 1500 (test_http_server's drain test)
SMALL_SERVER_ARGS = ("--max-running-requests", "8", "--max-queued-requests", "2", "--chunked-prefill-size", "128",
                     "--reasoning-parser", "qwen3", "--served-model-name", "smol", "--max-n", "4",
                     "--enable-priority-scheduling", "--drain-timeout", str(SMALL_SERVER_DRAIN_S))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class RunningServer:
    """A server subprocess; `stop()` sends SIGTERM and waits (then kills)."""

    process: subprocess.Popen[bytes]
    port: int
    log_path: str
    _terminated: bool = False

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @classmethod
    def start(cls, model_path: str | None, *extra: str, base_args: tuple[str, ...] = BASE_ARGS) -> RunningServer:
        """Start a server with `base_args` (pass () for the user's defaults) and `extra`; without
        a model path, on the shipped default model as `make serve` serves it."""
        port = free_port()
        model = ["--model-path", model_path] if model_path is not None else []
        cmd = [sys.executable, "-m", "tokenizer.http_server", *model, "--port", str(port), *base_args, *extra]
        # The child keeps its own copy of the log's descriptor; ours closes once it is started.
        with tempfile.NamedTemporaryFile(prefix="radixserve-http-", suffix=".log", delete=False) as log:
            process = subprocess.Popen(cmd, cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
        server = cls(process, port, log.name)
        try:
            server.wait_healthy()
        except BaseException:
            server.stop()
            raise
        return server

    def wait_healthy(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"server exited with {self.process.returncode}:\n{self.log()}")
            try:
                if requests.get(self.url + "/health", timeout=2).status_code == 200:
                    return
            except (requests.ConnectionError, requests.Timeout):
                pass
            time.sleep(0.05)
        raise TimeoutError(f"server not healthy in {START_TIMEOUT_S} s:\n{self.log()}")

    def log(self) -> str:
        with open(self.log_path, errors="replace") as fh:
            return fh.read()

    def stop(self, timeout: float = 30.0) -> int:
        self.terminate()
        return self.wait_stopped(timeout)

    def terminate(self) -> None:
        """Send SIGTERM (once: a second one stops without draining) unless it has exited."""
        if self.process.poll() is None and not self._terminated:
            self._terminated = True
            self.process.send_signal(signal.SIGTERM)

    def wait_stopped(self, timeout: float = 30.0) -> int:
        """Wait for the exit that `terminate` asked for; kill it after `timeout` s."""
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(10)
        return self.process.returncode

    def __enter__(self) -> RunningServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def post(server: RunningServer, path: str, body: Any, **kwargs: Any) -> requests.Response:
    return requests.post(server.url + path, json=body, timeout=kwargs.pop("timeout", 60), **kwargs)


def sse_events(response: requests.Response) -> Iterator[str]:
    """The `data:` payloads of an SSE response, in order ("[DONE]" included)."""
    for line in response.iter_lines():
        if line.startswith(b"data: "):
            yield line[len(b"data: "):].decode()


def server_state(server: RunningServer, headers: dict[str, str] | None = None) -> dict[str, Any]:
    info = requests.get(server.url + "/get_server_info", headers=headers, timeout=30).json()
    return dict(info["internal_states"][0])


def wait_idle(server: RunningServer, timeout: float = 15.0,
              headers: dict[str, str] | None = None) -> dict[str, Any]:
    """Poll until the scheduler runs and queues nothing; returns that state."""
    deadline = time.monotonic() + timeout
    while True:
        state = server_state(server, headers)
        if state["running"] == 0 and state["waiting"] == 0:
            return state
        assert time.monotonic() < deadline, f"scheduler still busy: {state}"
        time.sleep(0.1)


def wait_until(cond: Callable[[], bool], what: str, timeout: float = 30.0) -> None:
    """Poll `cond` every 20 ms; fail naming `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def metric(server: RunningServer, name: str) -> float:
    """The value of the first /metrics sample called `name` (0 when there is none yet)."""
    for line in requests.get(server.url + "/metrics", timeout=10).text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            return float(line.rsplit(" ", 1)[1])
    return 0.0
