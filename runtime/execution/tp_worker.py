"""Tensor parallelism's processes: rank 0's scheduler leads every forward step, ranks 1.. follow.

    rank 0 (the scheduler process)        ranks 1.. (one "tp-rank-N" process each)
    ModelRunner.forward(entries)          follow_steps(): receive (entries, keep_logits)
      -> StepLeader.before_forward(...) ->  runner.forward(entries, keep_logits)
      -> the same forward: every collective (all-reduces, logits gather, sampled ids) in step

Choice: rank 0 schedules and broadcasts the batch (as vLLM's driver worker does), rather than
broadcasting each step's incoming requests to one scheduler per rank (SGLang's design). Our
scheduler's decisions depend on timing: deadlines read the wall clock, grammar compiles end in a
helper process whenever they end, admission of a waiting request depends on when its grammar is
ready. Schedulers fed the same messages would part the first time a compile finished between
two steps on one rank and not on another, and that parting is silent: two ranks writing one
request's KV to different slots. One scheduler cannot disagree with itself. The cost is the
step's description (a few KB: a `TPStep` of ForwardEntry wire lists, JSON through
`runtime.contracts.codec` over the group's private channel, never pickle) sent each step, and ranks 1.. hold
no requests, no prefix cache and no sockets: only the model, their KV heads and the request table,
which the broadcast entries keep identical to rank 0's.

Every rank samples from the same gathered logits, then takes rank 0's ids (one broadcast of B
ints), so the future map that feeds the next decode is the same on every rank even if two
samplers ever disagreed.

Failure: a follower that dies is a child death for the launcher's watcher (every in-flight
request fails, the server exits), and rank 0's next collective fails too; if rank 0 dies, the
followers notice within a second while waiting for the next step (runtime/parallel/group.py), or at
their next collective, and exit. A follower that hangs stalls rank 0 inside a collective, which
the scheduler's watchdog reports.
"""

from __future__ import annotations

import logging
import os
import sys
import traceback
from multiprocessing.connection import Connection
from typing import TYPE_CHECKING

from runtime.contracts.codec import encode
from runtime.contracts.config import ServerConfig, read_model_json
from runtime.contracts.messages import ChildReady, SchedulerCrashed, TPStep, TPStop
from runtime.execution.tp_step import entry_from_wire

if TYPE_CHECKING:
    from runtime.execution.model_runner import ModelRunner
    from runtime.execution.model_setup import LoadedModel
    from runtime.parallel.group import TPGroup

logger = logging.getLogger("radixserve.tp")


def rank_name(rank: int) -> str:
    """The launcher's name of rank `rank`'s process (rank 0 is the scheduler)."""
    return "scheduler" if rank == 0 else f"tp-rank-{rank}"


def load_rank(config: ServerConfig, ipc_path: str, rank: int) -> LoadedModel:
    """Join the group (blocks until every rank has), then load this rank's part of the model."""
    from runtime.contracts.model_config import ModelConfig
    from runtime.execution.device import rank_device
    from runtime.execution.model_setup import load_model_for_serving
    from runtime.parallel.group import TensorParallel, init_tp_group
    from runtime.parallel.sharding import ShardPlan

    assert config.model_path is not None
    group = init_tp_group(rank, config.tp_size, ipc_path, rank_device(config.device, rank))
    model_config = ModelConfig.from_hf(read_model_json(config.model_path, "config.json"))
    tp = TensorParallel(ShardPlan.build(model_config, config.tp_size, rank), group)
    return load_model_for_serving(config, tp)


def follow_steps(runner: ModelRunner, group: TPGroup) -> None:
    """Run every step rank 0 sends, until it sends TPStop."""
    while True:
        step = group.broadcast_message(None)
        if isinstance(step, TPStop):
            return
        assert isinstance(step, TPStep), f"expected TPStep, got {type(step).__name__}"
        runner.forward([entry_from_wire(w) for w in step.entries], step.keep_logits)


def run_tp_rank_process(config: ServerConfig, ipc_path: str, ready_conn: Connection, rank: int) -> None:
    """The process of rank `rank` >= 1: load, report ready, follow rank 0 until it stops."""
    from runtime.execution.model_runner import ModelRunner
    from runtime.support.procutil import configure_child, watch_parent

    name = rank_name(rank)
    configure_child(config, name)
    watch_parent()
    try:
        loaded = load_rank(config, ipc_path, rank)
        runner = ModelRunner(loaded)
        ready_conn.send_bytes(encode(ChildReady(name, {"rank": rank})))
    except Exception:
        tb = traceback.format_exc()
        logger.error("%s failed to start:\n%s", name, tb)
        ready_conn.send_bytes(encode(SchedulerCrashed(name, tb)))
        sys.exit(1)
    assert loaded.tp is not None
    try:
        follow_steps(runner, loaded.tp.group)
    except Exception:  # a collective failed: another rank died; the launcher reports it
        logger.error("%s stopped: a collective failed:\n%s", name, traceback.format_exc())
        logging.shutdown()
        os._exit(1)
    loaded.tp.group.close()
