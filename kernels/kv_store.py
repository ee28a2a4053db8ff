"""The KV tier's store: fixed-size slots of one KV block each, in a memory-mapped region.

With a folder (`--kv-store DIR`) the region is the file DIR/kv-blocks.bin and outlives the process;
without one it is anonymous memory. The layout, every offset a multiple of 4096:

    [file header: magic, format, fingerprint, block layout]   4096 bytes
    slot i: [slot header: magic, block hash, parent hash, token ids, data crc32, header crc32]
            [data: K/V of the block's tokens, [layers][k, v][block_size][kv_heads][head_dim]]

Crash safety without fsync ordering tricks (kill -9 leaves the page cache intact): a write first
clears the slot header's magic, then writes the data, then the header body with the data's crc32,
then the header's own crc32 and the magic last. Killed anywhere in between, the slot reads as
empty or fails a checksum, and only that block is lost. A slot written by this process is trusted;
one found at start-up has its data crc checked the first time it is read. Power loss is not covered
(nothing is fsynced).

The store only moves bytes: which block lives in which slot is `radix/tier_index.py`'s business.
"""

from __future__ import annotations

import logging
import mmap
import os
import struct
import zlib
from dataclasses import dataclass

import torch

logger = logging.getLogger(__name__)

ALIGN = 4096
FILE_NAME = "kv-blocks.bin"
FILE_MAGIC = b"RSKVBLK1"
SLOT_MAGIC = b"RSKB"
_FILE_HEAD = struct.Struct("<8sI")  # magic, length of the JSON-free layout string that follows
_SLOT_HEAD = struct.Struct("<16s16sII")  # block hash, parent hash, token count, data crc32
_U32 = struct.Struct("<I")


def _round_up(n: int, to: int = ALIGN) -> int:
    return -(-n // to) * to


@dataclass(frozen=True)
class BlockLayout:
    """What one stored block holds; any difference makes a store unusable."""

    fingerprint: str  # the model, its weights and dtype (scheduler/kv_tier.py)
    block_size: int
    num_layers: int
    kv_heads: int
    head_dim: int
    dtype: torch.dtype

    @property
    def shape(self) -> tuple[int, int, int, int, int]:
        return (self.num_layers, 2, self.block_size, self.kv_heads, self.head_dim)

    @property
    def data_bytes(self) -> int:
        n = 1
        for dim in self.shape:
            n *= dim
        return n * torch.tensor([], dtype=self.dtype).element_size()

    @property
    def slot_bytes(self) -> int:
        return ALIGN + _round_up(self.data_bytes)

    def describe(self) -> bytes:
        return (f"{self.fingerprint}|{self.block_size}|{self.num_layers}|{self.kv_heads}|{self.head_dim}|"
                f"{self.dtype}|{self.slot_bytes}").encode()


class KVStore:
    """`num_slots` block slots in one mapped region (a file in `folder`, or anonymous memory)."""

    def __init__(self, layout: BlockLayout, capacity_bytes: int, folder: str | None = None) -> None:
        self.layout = layout
        self.num_slots = max((capacity_bytes - ALIGN) // layout.slot_bytes, 0)
        self.size = ALIGN + self.num_slots * layout.slot_bytes
        self.path = None if folder is None else os.path.join(folder, FILE_NAME)
        self.reused = False  # the file held a store of this layout: its blocks may be indexed
        self._mm = self._map()
        self._bytes = torch.frombuffer(self._mm, dtype=torch.uint8) if self.size else torch.empty(0, dtype=torch.uint8)
        self._unverified: set[int] = set()  # slots found at start-up whose data crc is unchecked
        self._fd = None if self.path is None else os.open(self.path, os.O_RDONLY)  # for reads (read_into)

    def _map(self) -> mmap.mmap:
        if self.path is None:
            return mmap.mmap(-1, self.size)
        os.makedirs(os.path.dirname(self.path), mode=0o700, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            self.reused = self._header_matches(fd)
            if not self.reused:
                os.ftruncate(fd, 0)  # a store of another model or layout: start empty
            os.ftruncate(fd, self.size)
            mm = mmap.mmap(fd, self.size)
        finally:
            os.close(fd)
        if not self.reused:
            head = self.layout.describe()
            mm[: _FILE_HEAD.size + len(head)] = _FILE_HEAD.pack(FILE_MAGIC, len(head)) + head
        return mm

    def _header_matches(self, fd: int) -> bool:
        raw = os.pread(fd, ALIGN, 0)
        if len(raw) < _FILE_HEAD.size:
            return False
        magic, n = _FILE_HEAD.unpack_from(raw)
        found = raw[_FILE_HEAD.size : _FILE_HEAD.size + n]
        if magic == FILE_MAGIC and found == self.layout.describe():
            return True
        logger.warning("kv store %s was written for another model or layout (%s); ignoring its blocks, "
                       "starting it empty", self.path, found[:120].decode(errors="replace"))
        return False

    def _offset(self, slot: int) -> int:
        assert 0 <= slot < self.num_slots, f"slot {slot} out of range {self.num_slots}"
        return ALIGN + slot * self.layout.slot_bytes

    def data(self, slot: int) -> torch.Tensor:
        """The slot's block as a [layers, 2, block_size, kv_heads, head_dim] view of the region."""
        start = self._offset(slot) + ALIGN
        raw = self._bytes[start : start + self.layout.data_bytes]
        return raw.view(self.layout.dtype).view(self.layout.shape)

    def write(self, slot: int, block: bytes, parent: bytes, token_ids: bytes, data: torch.Tensor) -> None:
        """Write one block (its K/V in `data`, laid out as `data(slot)`); see the module docstring
        for the order that makes a torn write read as empty."""
        off = self._offset(slot)
        self._mm[off : off + 4] = b"\0\0\0\0"
        self.data(slot).copy_(data)
        start = off + ALIGN
        crc = zlib.crc32(memoryview(self._mm)[start : start + self.layout.data_bytes])
        body = _SLOT_HEAD.pack(block, parent, len(token_ids) // 4, crc) + token_ids
        assert 12 + len(body) <= ALIGN, "slot header overflow"
        self._mm[off + 12 : off + 12 + len(body)] = body
        self._mm[off + 4 : off + 12] = _U32.pack(len(body)) + _U32.pack(zlib.crc32(body))
        self._mm[off : off + 4] = SLOT_MAGIC
        self._unverified.discard(slot)

    def header(self, slot: int, raw: bytes | None = None) -> tuple[bytes, bytes, bytes] | None:
        """(block hash, parent hash, token ids as int32 bytes) of a slot whose header is whole;
        `raw`: the slot's header page, when the caller read it already."""
        off = self._offset(slot)
        head = self._mm[off : off + ALIGN] if raw is None else raw
        if head[:4] != SLOT_MAGIC:
            return None
        n, crc = _U32.unpack_from(head, 4)[0], _U32.unpack_from(head, 8)[0]
        if not _SLOT_HEAD.size <= n <= ALIGN - 12:
            return None
        body = head[12 : 12 + n]
        if zlib.crc32(body) != crc:
            return None
        block, parent, count, _ = _SLOT_HEAD.unpack_from(body)
        tokens = body[_SLOT_HEAD.size :]
        return (block, parent, tokens) if len(tokens) == 4 * count else None

    def read(self, slot: int, block: bytes) -> torch.Tensor | None:
        """A copy of the slot's data if it holds `block` intact; None otherwise."""
        out = torch.empty(self.layout.shape, dtype=self.layout.dtype)
        return out if self.read_into(slot, block, out) else None

    def read_into(self, slot: int, block: bytes, out: torch.Tensor) -> bool:
        """Copy the slot's data into `out` (contiguous, `data(slot)`'s shape and dtype) if it holds
        `block` intact; a slot found at start-up has its data checksum checked once.

        NOTE: a file store is read with pread, not through the mapping: the first touch of each
        page of a fresh mapping faults, which costs far more than the kernel's copy from the page
        cache (after a restart every page is fresh)."""
        off = self._offset(slot)
        raw = os.pread(self._fd, ALIGN, off) if self._fd is not None else None
        head = self.header(slot, raw)
        if head is None or head[0] != block:
            return False
        dest = out.view(torch.uint8).reshape(-1).numpy().data  # a writable view of out
        if self._fd is not None:
            if os.preadv(self._fd, [dest], off + ALIGN) != self.layout.data_bytes:
                return False
        else:
            out.copy_(self.data(slot))
        if slot in self._unverified:
            assert raw is not None, "only a file store has slots found at start-up"
            if zlib.crc32(dest) != _SLOT_HEAD.unpack_from(raw, 12)[3]:
                return False
            self._unverified.discard(slot)
        return True

    def scan(self) -> list[tuple[int, bytes, bytes, bytes]]:
        """(slot, block, parent, token ids) of every slot with a whole header (start-up)."""
        if not self.reused:
            return []
        found = []
        assert self._fd is not None
        # NOTE: pread, not the mapping (see read_into): here one fault per slot header would cost
        # seconds over a large store.
        for slot in range(self.num_slots):
            head = self.header(slot, os.pread(self._fd, ALIGN, self._offset(slot)))
            if head is not None:
                found.append((slot, *head))
                self._unverified.add(slot)
        return found

    def erase(self, slot: int) -> None:
        off = self._offset(slot)
        self._mm[off : off + 4] = b"\0\0\0\0"
        self._unverified.discard(slot)

    def close(self) -> None:
        self._bytes = torch.empty(0, dtype=torch.uint8)  # the region's views must go before it
        self._mm.close()
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
