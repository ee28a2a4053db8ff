"""The private IPC directory and the PUSH/PULL sockets, within and across processes."""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import os
import stat

import pytest

from runtime.contracts import ipc
from runtime.contracts.ipc import AsyncPullSocket, IpcDir, PullSocket, PushSocket
from runtime.contracts.messages import AbortReq, BatchStrOut, FlushCacheReq, GenerateReq, ShutdownReq
from runtime.contracts.sampling import SamplingParams


@pytest.fixture
def ctx():
    context = ipc.new_context()
    yield context
    context.term()


def test_ipc_dir_is_private_and_removed():
    d = IpcDir()
    st = os.stat(d.path)
    assert stat.S_IMODE(st.st_mode) == 0o700 and st.st_uid == os.getuid()
    assert os.path.basename(d.path).startswith("radixserve-")
    assert d.endpoint("scheduler") == f"ipc://{d.path}/scheduler"
    d.cleanup()
    assert not os.path.exists(d.path)
    d.cleanup()  # idempotent


def test_ipc_dir_context_manager_and_non_owner(ctx):
    with IpcDir() as d:
        sock = PullSocket(ctx, d.endpoint("x"), bind=True)
        assert os.path.exists(os.path.join(d.path, "x"))
        sock.close()
        IpcDir(d.path).cleanup()  # a child's view does not own the directory
        assert os.path.isdir(d.path)
    assert not os.path.exists(d.path)


def test_endpoint_names_are_checked():
    with IpcDir() as d:
        for bad in ("", "../x", "a/b", "a b"):
            with pytest.raises(ValueError):
                d.endpoint(bad)
        with pytest.raises(ValueError, match="longer than"):
            d.endpoint("n" * 120)


def test_drain_returns_all_queued_in_order_and_recv_times_out(ctx):
    with IpcDir() as d:
        pull = PullSocket(ctx, d.endpoint("in"), bind=True)
        push = PushSocket(ctx, d.endpoint("in"))
        try:
            assert pull.recv(timeout_ms=50) is None
            assert pull.drain() == []
            sent = [FlushCacheReq(i) for i in range(100)]
            for m in sent:
                push.send(m)
            got = [pull.recv(timeout_ms=5000)]  # the first arrival; the rest are queued behind
            while len(got) < len(sent):
                got += pull.drain() or [pull.recv(timeout_ms=5000)]
            assert got == sent
            assert pull.recv(timeout_ms=50) is None
        finally:
            push.close()
            pull.close()


def test_sender_may_start_before_receiver(ctx):
    with IpcDir() as d:
        push = PushSocket(ctx, d.endpoint("late"))
        push.send(AbortReq("r1"))
        pull = PullSocket(ctx, d.endpoint("late"), bind=True)
        try:
            assert pull.recv(timeout_ms=5000) == AbortReq("r1")
        finally:
            push.close()
            pull.close()


def test_bound_push_without_peer_raises_after_its_wait(ctx):
    with IpcDir() as d:
        push = PushSocket(ctx, d.endpoint("nobody"), bind=True, linger_ms=0, send_timeout_ms=100)
        try:
            with pytest.raises(ConnectionError, match="read nothing for 0.1 s"):
                push.send(ShutdownReq())
        finally:
            push.close()


def test_a_receiver_that_falls_behind_makes_the_sender_wait_then_fail_and_nothing_is_lost(ctx):
    """Finite high-water marks: a receiver that does not read fills both queues; the sender then
    waits (here 200 ms) and raises; every message it did queue arrives, in order."""
    with IpcDir() as d:
        pull = PullSocket(ctx, d.endpoint("slow"), bind=True, hwm=4)
        push = PushSocket(ctx, d.endpoint("slow"), hwm=4, send_timeout_ms=200)
        try:
            sent = []
            with pytest.raises(ConnectionError, match="messages behind"):
                for i in range(100_000):  # bounded: the queues (and OS buffers) fill long before
                    push.send(FlushCacheReq(i))
                    sent.append(FlushCacheReq(i))
            assert len(sent) < 100_000
            got = []
            while len(got) < len(sent):
                got += pull.drain() or [pull.recv(timeout_ms=5000)]
            assert got == sent
            push.send(FlushCacheReq(-1))  # room again
            assert pull.recv(timeout_ms=5000) == FlushCacheReq(-1)
        finally:
            push.close()
            pull.close()


def _echo_child(ipc_path: str) -> None:
    """Child process: echo every message from "child" back to "parent" until ShutdownReq."""
    d = IpcDir(ipc_path)
    context = ipc.new_context()
    pull = PullSocket(context, d.endpoint("child"), bind=True)
    push = PushSocket(context, d.endpoint("parent"))
    try:
        while True:
            msg = pull.recv(timeout_ms=30_000)
            if msg is None:
                return
            push.send(msg)
            if isinstance(msg, ShutdownReq):
                return
    finally:
        pull.close()
        push.close()
        context.term()


def test_push_pull_across_processes(ctx):
    msgs = [
        GenerateReq("r", [1, 2, 3], SamplingParams(temperature=0.0, stop=["x"])),
        BatchStrOut(["r"], [None], ["ü"], [[4]], [3], [1], [0], [None], [None], [None], [None],
                    [None]),
        AbortReq(abort_all=True),
        ShutdownReq(),
    ]
    with IpcDir() as d:
        back = PullSocket(ctx, d.endpoint("parent"), bind=True)
        proc = mp.get_context("spawn").Process(target=_echo_child, args=(d.path,), daemon=True)
        proc.start()
        out = PushSocket(ctx, d.endpoint("child"))
        try:
            for m in msgs:
                out.send(m)
            got = []
            while len(got) < len(msgs):
                m = back.recv(timeout_ms=60_000)
                assert m is not None, f"no echo after {got}"
                got.append(m)
            assert got == msgs
            proc.join(timeout=30)
            assert proc.exitcode == 0
        finally:
            out.close()
            back.close()
            if proc.is_alive():
                proc.kill()


def test_async_pull(ctx):
    async def main(endpoint: str) -> list[object]:
        pull = AsyncPullSocket(ctx, endpoint, bind=True)
        push = PushSocket(ctx, endpoint)
        try:
            with pytest.raises(asyncio.TimeoutError):
                await asyncio.wait_for(pull.recv(), timeout=0.05)
            push.send(FlushCacheReq(1))
            first = await asyncio.wait_for(pull.recv(), timeout=5)
            for i in range(2, 5):
                push.send(FlushCacheReq(i))
            got = [first, await asyncio.wait_for(pull.recv(), timeout=5)]
            while len(got) < 4:
                got += pull.drain()
                await asyncio.sleep(0.001)
            assert pull.drain() == []
            return got
        finally:
            push.close()
            pull.close()

    with IpcDir() as d:
        got = asyncio.run(main(d.endpoint("async")))
    assert got == [FlushCacheReq(i) for i in range(1, 5)]
