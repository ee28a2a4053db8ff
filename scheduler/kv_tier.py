"""The KV tier: blocks the pool evicts stay loadable from a bigger, slower store.

Write-through, off the scheduler's critical path: when a request hands its KV to the radix cache
(`KVLedger.release`), its whole blocks that the store lacks are queued for the writer thread, and
the tree node covering them stays locked until the write is done, so eviction cannot recycle their
pool slots under the writer. The writer only gathers K/V from the pool and writes the store; the
index (`radix/tier_index.py`) and the locks belong to the scheduler thread, which applies finished
writes in `poll()` each iteration.

A prompt whose cached prefix ends at position m continues, block by block, into the store: when
loading those tokens is cheaper than computing them (`TierCosts`), admission gives them pool
slots and copies their K/V in (`load`), and the prefill starts after them. Loaded tokens are the
request's own, like computed ones, and go back to the tree when it releases them.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from dataclasses import dataclass, field

import torch

from kernels.kv_pool import KVPool
from kernels.kv_store import KVStore
from radix.blocks import BlockHash, BlockHasher, token_bytes
from radix.prefix_cache import BasePrefixCache
from radix.tier_index import TierIndex
from radix.tree import TreeNode
from scheduler.tier_costs import TierCosts, TierPlan

logger = logging.getLogger(__name__)


@dataclass
class _Write:
    """Blocks to write: block i of the job is tokens[i*B:(i+1)*B] at pool slots slots[i*B:...]."""

    node: TreeNode  # locked until the write is applied
    blocks: list[tuple[BlockHash, BlockHash, bytes, int]]  # (hash, parent hash, token ids, store slot)
    slots: list[int]
    seconds: float = 0.0
    ok: bool = True


@dataclass
class TierCounters:
    """What /get_load and /metrics report about the tier."""

    hits: int = 0  # admissions whose prompt continued into the store
    misses: int = 0  # admissions with whole blocks past the pool prefix, none of them stored
    hit_tokens: int = 0  # prompt tokens found in the store (loaded or not)
    loads_chosen: int = 0  # hits the cost model chose to load
    recomputes_chosen: int = 0  # hits it chose to compute
    loaded_tokens: int = 0
    loads: int = 0  # admissions that loaded from the store
    bytes_read: int = 0
    bytes_written: int = 0
    corrupt_blocks: int = 0
    restored_blocks: int = 0  # blocks indexed from the store at start-up

    def as_dict(self) -> dict[str, int]:
        return {f"tier_{k}": v for k, v in vars(self).items()}


@dataclass
class KVTier:
    """The store, its index, the writer thread and the load-or-recompute choice."""

    store: KVStore
    pool: KVPool
    cache: BasePrefixCache
    hasher: BlockHasher
    costs: TierCosts
    index: TierIndex = field(init=False)
    counters: TierCounters = field(default_factory=TierCounters)

    def __post_init__(self) -> None:
        self.block_size = self.hasher.block_size
        self.index = TierIndex(self.store.num_slots)
        self.index.load(self._restore())
        self._jobs: queue.Queue[_Write | None] = queue.Queue()
        self._done: queue.Queue[_Write] = queue.Queue()
        self._in_flight = 0
        self._staged = torch.empty((0, *self.store.layout.shape), dtype=self.store.layout.dtype)
        self._writer = threading.Thread(target=self._write_loop, name="kv-tier-writer", daemon=True)
        self._writer.start()

    def _restore(self) -> list[tuple[BlockHash, int]]:
        """Index the blocks a previous run left, dropping any whose hash is not its own tokens'."""
        found = []
        for slot, block, parent, tokens in self.store.scan():
            if self.hasher.chain(parent, tokens) != block:
                self.store.erase(slot)
                self.counters.corrupt_blocks += 1
                continue
            found.append((block, slot))
        self.counters.restored_blocks = len(found)
        if self.store.path is not None:
            logger.info("kv store %s: %d blocks restored, %d slots", self.store.path, len(found), self.store.num_slots)
        return found

    # ------------------------------------------------------------------ loading (admission)

    def plan(self, hashes: list[BlockHash], cached: int, limit: int) -> TierPlan:
        """What the store holds after the `cached` pool prefix, block by block up to position
        `limit`, and whether to load it (no side effects: admission may not go ahead)."""
        first, last = cached // self.block_size, limit // self.block_size
        run = self.index.run_length(hashes[:last], first)
        found = max((first + run) * self.block_size - cached, 0)
        return TierPlan(found, found > 0 and self.costs.prefer_load(found), found == 0 and first < last)

    def count(self, plan: TierPlan) -> None:
        """An admission went ahead with `plan`."""
        c = self.counters
        c.misses += plan.missed
        if plan.found:
            c.hits += 1
            c.hit_tokens += plan.found
            c.loads_chosen += plan.load
            c.recomputes_chosen += not plan.load

    def load(self, hashes: list[BlockHash], start: int, slots: list[int]) -> bool:
        """Copy the K/V of positions [start, start + len(slots)) from the store into `slots`.

        False (nothing usable written) when a block turns out corrupt: it is dropped from the
        store and the caller computes those tokens instead.
        """
        t0 = time.perf_counter()
        bs, end = self.block_size, start + len(slots)
        blocks = hashes[start // bs : end // bs]
        staged = self._staging(len(blocks))
        for i, block in enumerate(blocks):
            if not self.store.read_into(self.index.slot(block), block, staged[i]):
                self.store.erase(self.index.drop(block))
                self.counters.corrupt_blocks += 1
                return False
        skip = start - (start // bs) * bs
        idx = torch.tensor(slots, dtype=torch.int64, device=self.pool.device)
        for layer in range(len(self.pool.k)):
            for kv, dest in ((0, self.pool.k[layer]), (1, self.pool.v[layer])):
                src = staged[:, layer, kv].reshape(-1, *dest.shape[1:])[skip:]
                dest.index_copy_(0, idx, src.to(dest.device, non_blocking=True))
        if self.pool.device.type == "cuda":  # the forward runs on the runner's own stream: order it after the copies
            torch.cuda.current_stream(self.pool.device).synchronize()
        self.index.touch(blocks)
        seconds = time.perf_counter() - t0
        self.costs.observe_copy(len(slots), seconds)
        self.counters.loads += 1
        self.counters.loaded_tokens += len(slots)
        self.counters.bytes_read += len(blocks) * self.store.layout.data_bytes
        return True

    def _staging(self, n: int) -> torch.Tensor:
        """A host buffer for `n` blocks, kept and reused: fresh memory would fault page by page
        on every load."""
        if self._staged.shape[0] < n:
            self._staged = torch.empty((max(n, 2 * self._staged.shape[0]), *self.store.layout.shape),
                                       dtype=self.store.layout.dtype)
        return self._staged[:n]

    # ------------------------------------------------------------------ writing (release)

    def save(self, tokens: list[int], extra_key: str | None, hashes: list[BlockHash]) -> None:
        """Queue the whole blocks of `tokens` (just cached in the tree) that the store lacks."""
        bs = self.block_size
        n = min(len(hashes), len(tokens) // bs)
        new = [b for b in range(n) if not self.index.known(hashes[b])]
        if not new:
            self.index.touch(hashes[:n])
            return
        match = self.cache.match(tokens[: (new[-1] + 1) * bs], extra_key)
        if len(match.indices) < (new[-1] + 1) * bs:
            return  # not all in the tree (a page-aligned insert can stop short): nothing to copy from
        blocks, slots = [], []
        for b in new:
            reserved = self.index.reserve(hashes[b])
            if reserved is None:
                break  # every store slot is being written: these blocks are simply not kept
            parent = hashes[b - 1] if b > 0 else self.hasher.seed(extra_key)
            blocks.append((hashes[b], parent, token_bytes(tokens[b * bs : (b + 1) * bs]), reserved[0]))
            slots.extend(match.indices[b * bs : (b + 1) * bs])
        if not blocks:
            return
        self.cache.lock(match.node)
        self._in_flight += 1
        self._jobs.put(_Write(match.node, blocks, slots))

    def _write_loop(self) -> None:
        while (job := self._jobs.get()) is not None:
            t0 = time.perf_counter()
            try:
                self._write(job)
            except Exception:  # a failed write loses those blocks, never the scheduler
                logger.exception("kv tier write failed")
                job.ok = False
            job.seconds = time.perf_counter() - t0
            self._done.put(job)

    def _write(self, job: _Write) -> None:
        pool, bs, n = self.pool, self.block_size, len(job.blocks)
        idx = torch.tensor(job.slots, dtype=torch.int64, device=pool.device)
        staged = torch.empty((n, *self.store.layout.shape), dtype=self.store.layout.dtype)
        for layer in range(len(pool.k)):
            for kv, src in ((0, pool.k[layer]), (1, pool.v[layer])):
                staged[:, layer, kv] = src.index_select(0, idx).view(n, bs, *src.shape[1:]).cpu()
        for i, (block, parent, token_ids, slot) in enumerate(job.blocks):
            self.store.write(slot, block, parent, token_ids, staged[i])

    def poll(self) -> None:
        """Apply finished writes: index their blocks, unlock their tree nodes."""
        while True:
            try:
                job = self._done.get_nowait()
            except queue.Empty:
                return
            self._apply(job)

    def _apply(self, job: _Write) -> None:
        for block, *_ in job.blocks:
            if job.ok:
                self.index.commit(block)
            else:
                self.index.abort(block)
        if job.ok:
            self.counters.bytes_written += len(job.blocks) * self.store.layout.data_bytes
        self.cache.unlock(job.node)
        self._in_flight -= 1

    @property
    def writing(self) -> bool:
        return self._in_flight > 0

    def drain(self) -> None:
        """Wait for every queued write and apply it (before idle checks and flushes)."""
        while self._in_flight:
            self._apply(self._done.get())

    def clear(self) -> None:
        """Forget and erase every stored block (/flush_cache)."""
        self.drain()
        for slot in self.index.clear():
            self.store.erase(slot)

    def close(self) -> None:
        self._jobs.put(None)
        self._writer.join(timeout=10)
        self.drain()
        self.store.close()

    def check_integrity(self) -> None:
        self.index.check_integrity()

    def state(self) -> dict[str, float | int]:
        return {**self.counters.as_dict(), "tier_blocks": len(self.index), "tier_slots": self.index.num_slots,
                "tier_block_bytes": self.store.layout.data_bytes, "tier_evictions": self.index.evictions,
                **self.costs.state()}
