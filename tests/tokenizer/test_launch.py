"""Launch, crash propagation and shutdown of the runtime's processes (fake scheduler, real
detokenizer). Each test here needs a fresh runtime, since each one breaks it."""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from runtime.contracts.config import ServerConfig
from runtime.contracts.errors import RuntimeCrashed
from scheduler.watchdog import WATCHDOG_EXIT_CODE
from tests.tokenizer.fake_scheduler import (
    CRASH_PROMPT,
    EXIT_CODE,
    orphan_middle,
    run_dying_scheduler,
    run_fake_scheduler,
    run_sleepy_scheduler,
)
from tests.tokenizer.faulty_scheduler import FAULT_MESSAGE, FAULT_PROMPT, HANG_PROMPT, run_faulty_scheduler
from tokenizer import launch
from tokenizer.engine import Engine
from tokenizer.launch import LaunchError, launch_runtime

WAIT_S = 15.0


@pytest.fixture
def private_tmp(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A private temp dir for the IPC directories, so leftovers are ours to count."""
    path = tempfile.mkdtemp(prefix="rst-")
    monkeypatch.setattr(tempfile, "tempdir", path)
    yield path
    os.rmdir(path)  # fails if anything was left behind


@pytest.fixture
def config(default_model_path: str) -> ServerConfig:
    """Small context and KV pool: these tests send a few short requests, and the CPU default pool
    (65536 tokens, 1.5 GB in bf16) would cost each real scheduler start about a second to zero."""
    from runtime.execution.resolve import resolve_config

    return resolve_config(ServerConfig(model_path=default_model_path, context_length=256, max_total_tokens=4096))


def _wait_for(cond: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def _gone(pid: int) -> bool:
    """The process no longer exists or is a zombie (exited, not yet reaped)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def _pending_generate(engine: Engine) -> tuple[threading.Thread, dict[str, Any]]:
    """A long request running in a thread; its exception lands in the returned dict. (The fake
    scheduler's state lists running rids; the real one's counts them.)"""
    box: dict[str, Any] = {}

    def work() -> None:
        try:
            box["result"] = engine.generate(
                input_ids=[1, 2, 3], sampling_params={"max_new_tokens": 200}, rid="victim")
        except BaseException as exc:  # noqa: BLE001 - the test inspects it
            box["error"] = exc

    worker = threading.Thread(target=work)
    worker.start()
    def running() -> bool:  # the scheduler sees a server-made rid, not "victim"
        state = engine.get_state()["running"]
        return len(state) > 0 if isinstance(state, list) else state > 0

    _wait_for(running, "the request to run")
    return worker, box


def _assert_dead_and_clean(engine: Engine, private_tmp: str) -> None:
    procs = list(engine._runtime.processes.values())
    _wait_for(lambda: not any(p.is_alive() for p in procs), "the children to exit")
    with pytest.raises(RuntimeCrashed):
        engine.generate("new request")  # fails at once
    engine.shutdown()
    engine.shutdown()  # idempotent
    assert os.listdir(private_tmp) == []


def test_launch_fails_fast_when_a_child_dies(
    config: ServerConfig, private_tmp: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The death is noticed at once: waiting for the ready timeout would fail with its message."""
    monkeypatch.setitem(launch.READY_TIMEOUT_S, "scheduler", 120.0)
    with pytest.raises(LaunchError, match=f"scheduler process exited with code {EXIT_CODE}"):
        launch_runtime(config, scheduler_target=run_dying_scheduler)
    assert mp.active_children() == [] and os.listdir(private_tmp) == []


def test_scheduler_exception_fails_requests(config: ServerConfig, private_tmp: str) -> None:
    engine = Engine.from_config(config, scheduler_target=run_fake_scheduler)
    worker, box = _pending_generate(engine)
    with pytest.raises(RuntimeCrashed, match="scheduler process crashed: RuntimeError"):
        engine.generate(input_ids=CRASH_PROMPT)
    worker.join(WAIT_S)
    assert isinstance(box.get("error"), RuntimeCrashed)  # woken by the crash, not left waiting
    assert not engine.is_healthy
    _assert_dead_and_clean(engine, private_tmp)


def test_real_scheduler_forward_exception_fails_requests(config: ServerConfig, private_tmp: str) -> None:
    """The real scheduler process (real model) whose forward raises: the crash is reported with
    its traceback, every in-flight request fails, and the tree exits."""
    engine = Engine.from_config(config, scheduler_target=run_faulty_scheduler)
    worker, box = _pending_generate(engine)
    scheduler = engine._runtime.processes["scheduler"]
    with pytest.raises(RuntimeCrashed, match=f"scheduler process crashed: RuntimeError: {FAULT_MESSAGE}"):
        engine.generate(input_ids=FAULT_PROMPT + [1, 2], sampling_params={"max_new_tokens": 4})
    worker.join(WAIT_S)
    assert isinstance(box.get("error"), RuntimeCrashed)  # the request running beside it fails too
    assert not engine.is_healthy
    _assert_dead_and_clean(engine, private_tmp)
    assert scheduler.exitcode == 1  # the scheduler exits non-zero after reporting


def test_watchdog_ends_a_hung_forward(config: ServerConfig, private_tmp: str) -> None:
    """A forward that never returns: after --watchdog-timeout the scheduler reports (its stacks in
    the crash), every in-flight request fails, the engine is unhealthy, and the tree exits."""
    engine = Engine.from_config(config.replace(watchdog_timeout=2.0), scheduler_target=run_faulty_scheduler)
    worker, box = _pending_generate(engine)
    scheduler = engine._runtime.processes["scheduler"]
    with pytest.raises(RuntimeCrashed, match="WatchdogTimeout: the scheduler made no progress"):
        engine.generate(input_ids=HANG_PROMPT + [1, 2], sampling_params={"max_new_tokens": 4})
    worker.join(WAIT_S)
    assert isinstance(box.get("error"), RuntimeCrashed)
    assert not engine.is_healthy
    _assert_dead_and_clean(engine, private_tmp)
    assert scheduler.exitcode == WATCHDOG_EXIT_CODE


@pytest.mark.parametrize("child", ["scheduler", "detokenizer"])
def test_a_killed_child_fails_requests(config: ServerConfig, private_tmp: str, child: str) -> None:
    engine = Engine.from_config(config, scheduler_target=run_fake_scheduler)
    worker, box = _pending_generate(engine)
    os.kill(engine._runtime.processes[child].pid, signal.SIGKILL)
    worker.join(WAIT_S)
    error = box.get("error")
    assert isinstance(error, RuntimeCrashed)
    assert f"{child} process exited with code -9" in str(error)
    _assert_dead_and_clean(engine, private_tmp)


def test_launch_times_out(
    config: ServerConfig, private_tmp: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(launch.READY_TIMEOUT_S, "scheduler", 1.0)
    with pytest.raises(LaunchError, match="scheduler process was not ready within 1 s"):
        launch_runtime(config, scheduler_target=run_sleepy_scheduler)
    assert mp.active_children() == [] and os.listdir(private_tmp) == []


def test_clean_shutdown_fails_waiters(config: ServerConfig, private_tmp: str) -> None:
    engine = Engine.from_config(config, scheduler_target=run_fake_scheduler)
    procs = list(engine._runtime.processes.values())
    worker, box = _pending_generate(engine)
    engine.shutdown()
    worker.join(WAIT_S)
    assert isinstance(box.get("error"), RuntimeCrashed)
    assert [p.exitcode for p in procs] == [0, 0]  # both left on ShutdownReq
    assert os.listdir(private_tmp) == []


def test_children_exit_when_their_parent_dies() -> None:
    recv_end, send_end = mp.Pipe(duplex=False)
    middle = mp.get_context("spawn").Process(target=orphan_middle, args=(send_end,))
    middle.start()
    assert recv_end.poll(WAIT_S)
    leaf_pid = recv_end.recv()
    middle.join(WAIT_S)
    _wait_for(lambda: _gone(leaf_pid), "the orphan to exit")


def test_import_runtime_is_lazy() -> None:
    code = ("import sys, runtime, tokenizer.launch, tokenizer.native.generate, tokenizer.request_state\n"
            "import detokenizer.manager\n"
            "assert 'torch' not in sys.modules and 'transformers' not in sys.modules\n"
            "from runtime import Engine\n"
            "assert Engine.__name__ == 'Engine'\n")
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    subprocess.run([sys.executable, "-c", code], check=True, cwd=root, timeout=60)
