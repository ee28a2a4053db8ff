"""What crosses between tensor-parallel ranks: no pickle anywhere (torch's `*_object*` collectives
would unpickle whatever a local stranger sends to gloo's TCP listener), step descriptions as codec
messages over the private IPC directory, a follower that sleeps while it waits and notices rank
0's death, and a whole two-rank group (rank 1 spawned) with unpickling made impossible."""

from __future__ import annotations

import dataclasses
import multiprocessing as mp
import os
import pickle
import re
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import orjson
import pytest
import torch
import torch.distributed.distributed_c10d as c10d

from runtime.contracts.codec import decode, encode
from runtime.contracts.messages import TPStep, TPStop
from runtime.contracts.sampling import SamplingParams
from runtime.execution import tp_step, tp_worker
from runtime.execution.forward_batch import ForwardEntry
from runtime.execution.tp_step import entry_from_wire, entry_to_wire
from runtime.parallel import group as tp_group
from runtime.parallel import shm_collectives
from runtime.parallel.group import StepChannel, init_tp_group

TP_MODULES = [tp_group, tp_step, tp_worker, shm_collectives]


def rich_entry() -> ForwardEntry:
    """An entry with every optional part set, so a field the wire form loses shows."""
    sampling = SamplingParams(temperature=0.7, top_p=0.9, top_k=20, min_p=0.05, frequency_penalty=0.5,
                              presence_penalty=-0.25, repetition_penalty=1.1, min_new_tokens=2, stop=["</s>"],
                              stop_token_ids=[2], logit_bias={17: -3.5, 4: 2.0}, seed=12345, ignore_eos=True,
                              regex="[0-9]+", grammar_after_ids=[151668])
    return ForwardEntry(row=3, input_ids=[10, 11, 12], prefix_len=5, kv_write=[40, 41, 42], kv_write_start=5,
                        sampling=sampling, output_ids=[7, 8], stop_ids=[2], return_logprob=True, top_logprobs_num=3,
                        logprob_start=1, logprob_targets=[11, 12], input_from_future=True,
                        token_bitmask=torch.tensor([-1, 0, 0x7FFF_FFFF, -(2**31)], dtype=torch.int32),
                        draft_ids=[12])


def assert_same_entry(got: ForwardEntry, want: ForwardEntry) -> None:
    for f in dataclasses.fields(ForwardEntry):
        a, b = getattr(got, f.name), getattr(want, f.name)
        if isinstance(b, torch.Tensor):
            assert a.dtype == b.dtype and torch.equal(a, b), f.name
        else:
            assert a == b, f.name


def test_step_messages_round_trip_through_the_codec() -> None:
    entries = [rich_entry(), ForwardEntry(row=0, input_ids=[1], prefix_len=8, kv_write=[0], kv_write_start=8)]
    step = decode(encode(TPStep([entry_to_wire(e) for e in entries], True)))
    assert isinstance(step, TPStep) and step.keep_logits is True
    for wire, want in zip(step.entries, entries):
        assert_same_entry(entry_from_wire(wire), want)
    assert isinstance(decode(encode(TPStop())), TPStop)


def test_no_pickle_in_the_tp_modules() -> None:
    for module in TP_MODULES:
        source = Path(module.__file__).read_text()
        assert not re.search(r"^\s*(import|from)\s+\w*pickle", source, re.M), module.__name__
        assert not re.search(r"\w+_object(_list)?\s*\(", source), module.__name__  # torch.distributed's


@pytest.fixture
def ipc_path() -> Iterator[str]:
    with tempfile.TemporaryDirectory(prefix="rs-tp-") as path:  # 0700, short enough for ipc://
        yield path


def test_a_follower_sleeps_while_it_waits(ipc_path: str) -> None:
    leader, follower = StepChannel(ipc_path, 0, 2), StepChannel(ipc_path, 1, 2)
    follower.leader_pid = os.getpid()
    try:
        later = threading.Timer(1.5, leader.send, [TPStep([], False)])  # past a leader check
        later.start()
        cpu, wall = time.thread_time(), time.monotonic()
        assert follower.receive() == TPStep([], False)
        assert time.monotonic() - wall >= 1.4
        assert time.thread_time() - cpu < 0.2  # asleep in a poll, not spinning
        leader.send(TPStop())
        assert isinstance(follower.receive(), TPStop)
    finally:
        later.join()
        leader.close()
        follower.close()


def test_a_waiting_follower_notices_that_rank_0_is_gone(ipc_path: str) -> None:
    gone = subprocess.Popen(["true"])
    gone.wait()  # reaped: its pid names no process
    follower = StepChannel(ipc_path, 1, 2)
    follower.leader_pid = gone.pid
    try:
        with pytest.raises(RuntimeError, match=f"rank 0 \\(pid {gone.pid}\\) is gone"):
            follower.receive()
    finally:
        follower.close()


def test_a_shared_ipc_directory_is_refused(ipc_path: str) -> None:
    os.chmod(ipc_path, 0o755)
    with pytest.raises(RuntimeError, match="private IPC directory"):
        init_tp_group(0, 2, ipc_path, torch.device("cpu"))


# ---------------------------------------------------------------- a real two-rank group


class _NoUnpickling:
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise AssertionError("pickle used between tensor-parallel ranks")


def _refuse(*args: Any, **kwargs: Any) -> Any:
    raise AssertionError("pickle used between tensor-parallel ranks")


NO_PICKLE = [(pickle, "loads", _refuse), (pickle, "load", _refuse), (pickle, "Unpickler", _NoUnpickling),
             (c10d, "_unpickler", _NoUnpickling), (c10d, "_pickler", _NoUnpickling)]


def rank1_main(ipc_path: str, conn: Connection) -> None:
    """Rank 1 with unpickling impossible: the same calls as rank 0, then report (as JSON)."""
    for owner, name, stand_in in NO_PICKLE:
        setattr(owner, name, stand_in)
    group = init_tp_group(1, 2, ipc_path, torch.device("cpu"))
    report: dict[str, Any] = {"shm": group.shm is not None, "min": group.min_int(9)}
    report["sum"] = group.all_reduce(torch.full((4,), 2.0)).tolist()
    report["ids"] = group.broadcast_(torch.zeros(3, dtype=torch.int64)).tolist()
    step = group.broadcast_message(None)
    report["step"] = [entry_to_wire(entry_from_wire(w)) for w in step.entries]
    cpu = time.process_time()
    report["stop"] = isinstance(group.broadcast_message(None), TPStop)
    report["idle_cpu"] = time.process_time() - cpu
    group.close()
    conn.send_bytes(orjson.dumps(report))


def test_two_ranks_exchange_no_pickle(ipc_path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    ctx = mp.get_context("spawn")
    recv_end, send_end = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=rank1_main, args=(ipc_path, send_end), daemon=True)
    proc.start()  # (spawning pickles the process object: before pickle is taken away)
    send_end.close()
    for owner, name, stand_in in NO_PICKLE:
        monkeypatch.setattr(owner, name, stand_in)
    made: list[str] = []
    new_path = shm_collectives.new_path
    monkeypatch.setattr(shm_collectives, "new_path", lambda: made.append(new_path()) or made[-1])
    try:
        group = init_tp_group(0, 2, ipc_path, torch.device("cpu"))
        assert not any(os.path.exists(p) for p in made)  # mapped by both, then unlinked
        assert group.min_int(5) == 5
        assert group.all_reduce(torch.full((4,), 1.0)).tolist() == [3.0] * 4
        group.broadcast_(torch.tensor([7, 8, 9]))
        entries = [rich_entry()]
        group.broadcast_message(TPStep([entry_to_wire(e) for e in entries], False))
        time.sleep(1.5)  # rank 1 waits for the next message meanwhile
        group.broadcast_message(TPStop())
        group.close()
        assert recv_end.poll(60)
        report = orjson.loads(recv_end.recv_bytes())
    finally:
        proc.join(timeout=30)
        if proc.is_alive():
            proc.kill()
    assert proc.exitcode == 0
    assert report["shm"] == shm_collectives.available() == bool(made)
    assert (report["min"], report["sum"], report["ids"]) == (5, [3.0] * 4, [7, 8, 9])
    assert report["step"] == orjson.loads(orjson.dumps([entry_to_wire(e) for e in entries]))
    assert report["stop"] and report["idle_cpu"] < 0.5
