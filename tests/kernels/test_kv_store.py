"""The KV tier's store: blocks round-trip, a store of another layout is ignored, and a process
killed with SIGKILL in the middle of writes never leaves a block that reads back wrong."""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

from kernels.kv_store import FILE_NAME, BlockLayout, KVStore

LAYOUT = BlockLayout("test-fingerprint", 4, 3, 2, 8, torch.bfloat16)


def block_data(seed: int) -> torch.Tensor:
    """A block whose every value is determined by `seed` (what a reader can check it against)."""
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(LAYOUT.shape, generator=gen).to(LAYOUT.dtype)


def key(seed: int) -> bytes:
    return seed.to_bytes(16, "little")


def test_blocks_round_trip_and_survive_reopening(tmp_path: Path) -> None:
    store = KVStore(LAYOUT, 1 << 20, str(tmp_path))
    assert store.num_slots > 4
    for slot in range(4):
        store.write(slot, key(slot + 10), key(slot + 9), b"\1\0\0\0" * 4, block_data(slot + 10))
    read = store.read(2, key(12))
    assert read is not None and torch.equal(read, block_data(12))
    assert store.read(2, key(13)) is None  # another block's hash
    store.close()
    again = KVStore(LAYOUT, 1 << 20, str(tmp_path))
    assert [(slot, block) for slot, block, _, _ in again.scan()] == [(s, key(s + 10)) for s in range(4)]
    read = again.read(3, key(13))
    assert read is not None and torch.equal(read, block_data(13))
    again.close()


def test_a_store_of_another_layout_is_ignored(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    store = KVStore(LAYOUT, 1 << 20, str(tmp_path))
    store.write(0, key(1), key(0), b"", block_data(1))
    store.close()
    other = dataclasses.replace(LAYOUT, fingerprint="another-model")
    reopened = KVStore(other, 1 << 20, str(tmp_path))
    assert not reopened.reused and reopened.scan() == []
    assert "another model or layout" in caplog.text
    reopened.close()


def test_a_flipped_data_byte_drops_only_that_block(tmp_path: Path) -> None:
    store = KVStore(LAYOUT, 1 << 20, str(tmp_path))
    for slot in range(3):
        store.write(slot, key(slot), key(0), b"", block_data(slot))
    store.close()
    with open(tmp_path / FILE_NAME, "r+b") as fh:
        fh.seek(4096 + 1 * LAYOUT.slot_bytes + 4096 + 7)
        byte = fh.read(1)[0]
        fh.seek(-1, 1)
        fh.write(bytes([byte ^ 1]))
    again = KVStore(LAYOUT, 1 << 20, str(tmp_path))
    assert len(again.scan()) == 3  # headers are whole; the data crc is checked on first read
    assert again.read(1, key(1)) is None
    for slot in (0, 2):
        read = again.read(slot, key(slot))
        assert read is not None and torch.equal(read, block_data(slot))
    again.close()


WRITER = textwrap.dedent("""
    import sys, torch
    from kernels.kv_store import KVStore
    from tests.kernels.test_kv_store import LAYOUT, block_data, key
    store = KVStore(LAYOUT, 1 << 20, sys.argv[1])
    seed = int(sys.argv[2])
    print("ready", flush=True)
    while True:  # overwrite slots round-robin with ever new blocks until killed
        slot = seed % store.num_slots
        store.write(slot, key(seed), key(seed - 1), b"", block_data(seed))
        seed += 1
""")


def test_sigkill_during_writes_leaves_no_wrong_block(tmp_path: Path) -> None:
    root = Path(__file__).resolve().parents[2]
    for delay_ms in (5, 40, 120):  # each writer overwrites what the one before it left
        proc = subprocess.Popen([sys.executable, "-c", WRITER, str(tmp_path), str(1000 * delay_ms)],
                                cwd=root, stdout=subprocess.PIPE, env={**os.environ, "PYTHONPATH": str(root)})
        assert proc.stdout is not None and proc.stdout.readline().strip() == b"ready"
        time.sleep(delay_ms / 1000)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    store = KVStore(LAYOUT, 1 << 20, str(tmp_path))
    found = store.scan()
    assert found, "the writers wrote nothing before they were killed"
    for slot, block, _, _ in found:
        read = store.read(slot, block)
        if read is not None:  # a torn block may read as None; one that reads must be right
            assert torch.equal(read, block_data(int.from_bytes(block, "little"))), f"slot {slot} reads wrong data"
    store.close()
