"""Which KV blocks the tier store holds, in which of its slots, least recently used first.

The tier store (`kernels/kv_store.py`) has a fixed number of slots, one block of KV each. This
index is its bookkeeping, owned by the scheduler thread alone:

    free slots        never written, or emptied
    pending           block hash -> slot being written by the writer thread (not loadable yet,
                      never evicted: the writer owns the slot until `commit` or `abort`)
    committed (LRU)   block hash -> slot, oldest use first; a full store evicts from the front

A session's blocks are useful only as a run from its first block: `touch` marks a run newest
from its last block back to its first, so eviction takes the tail of a cold run before its head.

Stdlib only.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Sequence

from radix.blocks import BlockHash


class TierIndex:
    """Block hash -> store slot, with LRU eviction.

    Args:
        num_slots: the store's capacity in blocks.
    """

    def __init__(self, num_slots: int) -> None:
        self.num_slots = num_slots
        self._committed: OrderedDict[BlockHash, int] = OrderedDict()
        self._pending: dict[BlockHash, int] = {}
        self._free: list[int] = list(range(num_slots - 1, -1, -1))
        self.evictions = 0

    def __len__(self) -> int:
        return len(self._committed)

    def __contains__(self, block: BlockHash) -> bool:
        return block in self._committed

    def known(self, block: BlockHash) -> bool:
        """Held or being written: writing it again would be wasted work."""
        return block in self._committed or block in self._pending

    def slot(self, block: BlockHash) -> int:
        return self._committed[block]

    def run_length(self, blocks: Sequence[BlockHash], first: int) -> int:
        """How many of blocks[first:] the store holds, consecutively from `first`."""
        n = first
        while n < len(blocks) and blocks[n] in self._committed:
            n += 1
        return n - first

    def touch(self, blocks: Sequence[BlockHash]) -> None:
        """Mark a run of held blocks used now, its first block newest."""
        for block in reversed(blocks):
            if block in self._committed:
                self._committed.move_to_end(block)

    def reserve(self, block: BlockHash) -> tuple[int, BlockHash | None] | None:
        """A slot to write `block` into: a free one, else the least recently used block's.

        Returns (slot, the evicted block or None), or None when every slot is being written.
        The block is pending until `commit` or `abort`.
        """
        assert not self.known(block), "reserve of a block already held or pending"
        evicted: BlockHash | None = None
        if self._free:
            slot = self._free.pop()
        elif self._committed:
            evicted, slot = self._committed.popitem(last=False)
            self.evictions += 1
        else:
            return None
        self._pending[block] = slot
        return slot, evicted

    def commit(self, block: BlockHash) -> None:
        """The writer finished `block`: it is held, newest."""
        self._committed[block] = self._pending.pop(block)

    def abort(self, block: BlockHash) -> None:
        """The write of `block` did not happen: its slot is free again."""
        self._free.append(self._pending.pop(block))

    def drop(self, block: BlockHash) -> int:
        """Forget a held block (found corrupt); returns its slot, now free."""
        slot = self._committed.pop(block)
        self._free.append(slot)
        return slot

    def load(self, entries: Iterable[tuple[BlockHash, int]]) -> None:
        """Index blocks found in the store at start-up, oldest first."""
        taken: set[int] = set()
        for block, slot in entries:
            assert block not in self._committed and slot not in taken, "a block in two slots, or two in one"
            taken.add(slot)
            self._committed[block] = slot
        self._free = [slot for slot in self._free if slot not in taken]

    def clear(self) -> list[int]:
        """Forget every held block (pending writes stay); returns the slots they held."""
        slots = list(self._committed.values())
        self._committed.clear()
        self._free.extend(slots)
        return slots

    @property
    def pending(self) -> int:
        return len(self._pending)

    def check_integrity(self) -> None:
        """Every slot is exactly one of free, pending or committed."""
        used = list(self._committed.values()) + list(self._pending.values()) + self._free
        assert sorted(used) == list(range(self.num_slots)), (
            f"tier slots: {len(self._committed)} held + {len(self._pending)} pending + {len(self._free)} free "
            f"do not cover {self.num_slots} slots exactly once"
        )
