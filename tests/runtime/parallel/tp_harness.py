"""Tensor parallelism in tests: rank 0 in the test process, ranks 1.. as real follower processes.

    with tp_runner(config) as runner:        # rank 0's ModelRunner, leading the others
        runner.forward(entries)
    with tp_scheduler(config, io) as sched:  # rank 0's whole Scheduler (tests/scheduler/harness)

Rank 0 joins the group in this process and leaves it (destroy_process_group) at the end, so a
later test can join another group; the torch thread count it sets for its rank is restored.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import tempfile
from collections.abc import Iterator
from typing import Any

import torch

from runtime.contracts.config import ServerConfig
from runtime.execution.model_runner import ModelRunner
from runtime.execution.tp_worker import load_rank, run_tp_rank_process

JOIN_S = 30.0


@contextlib.contextmanager
def followers(config: ServerConfig, ipc_path: str) -> Iterator[list[mp.process.BaseProcess]]:
    """Ranks 1..tp_size-1 as spawned processes; joined (or killed) at the end."""
    ctx = mp.get_context("spawn")
    procs = []
    for rank in range(1, config.tp_size):
        recv_end, send_end = ctx.Pipe(duplex=False)
        proc = ctx.Process(target=run_tp_rank_process, args=(config, ipc_path, send_end, rank), daemon=True)
        proc.start()
        send_end.close()
        procs.append(proc)
    threads = torch.get_num_threads()
    try:
        yield procs
    except BaseException:
        _stop(procs)
        raise
    finally:
        torch.set_num_threads(threads)
    _stop(procs)
    # Released by rank 0's STOP, each follower left the group and exited cleanly.
    assert [p.exitcode for p in procs] == [0] * len(procs)


def _stop(procs: list[mp.process.BaseProcess]) -> None:
    for proc in procs:
        proc.join(timeout=JOIN_S)
        if proc.is_alive():
            proc.kill()
            proc.join()


@contextlib.contextmanager
def tp_runner(config: ServerConfig) -> Iterator[ModelRunner]:
    with tempfile.TemporaryDirectory() as ipc_path, followers(config, ipc_path):
        runner = ModelRunner(load_rank(config, ipc_path, 0))
        runner.lead_tensor_parallel()
        try:
            yield runner
        finally:
            runner.close()


@contextlib.contextmanager
def tp_scheduler(config: ServerConfig, io: Any) -> Iterator[Any]:
    from scheduler.process import build_scheduler

    with tempfile.TemporaryDirectory() as ipc_path, followers(config, ipc_path):
        sched = build_scheduler(config, io, ipc_path)
        try:
            yield sched
        finally:
            sched.runner.close()
