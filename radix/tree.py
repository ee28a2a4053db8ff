"""Radix tree from token sequences to KV slot ids (the prefix cache's index).

Each edge (node) holds a run of token ids `key` and the KV slots `value` that hold their K/V,
`len(key) == len(value)`. A path from the root spells a cached token prefix. Children are keyed
by `(extra_key, first token)` or, with page_size > 1, `(extra_key, first page tuple)`, so
different `extra_key` namespaces never share a node below the shared root.

With page_size > 1 everything is page aligned: queries are truncated to whole pages, edges are
whole pages long and splits happen only on page boundaries.

Sizes are in tokens: `evictable_size` counts nodes with lock_ref 0, `protected_size` nodes with
lock_ref > 0 (root excluded). They are properties, kept up to date incrementally and recomputed by
`check_integrity()`.

Blocks (`radix/blocks.py`), when the tree is given a block size: each node also keeps `start`, the
position of its first token, and `hashes`, the chained hashes of the blocks whose last token it
holds (those are the blocks that enter the pool with it and leave with it). Those hashes are what
the tier store and the KV events know the node's KV by; an optional `BlockEventSink` hears every
block stored, removed and cleared.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Iterator, Sequence
from typing import NamedTuple

from radix.blocks import BlockEventSink, BlockHash, blocks_ending_in

ChildKey = tuple[str | None, int | tuple[int, ...]]


class TreeNode:
    """One edge of the radix tree (the root has an empty key).

    `last_access` is a tick of the tree's operation counter, not wall time, so eviction order is
    deterministic. `lock_ref` counts the running requests whose matched prefix passes through it.
    """

    __slots__ = ("children", "parent", "key", "value", "lock_ref", "last_access", "extra_key", "id", "start",
                 "hashes")

    def __init__(
        self,
        key: tuple[int, ...],
        value: list[int],
        parent: TreeNode | None,
        extra_key: str | None,
        node_id: int,
        last_access: int = 0,
        lock_ref: int = 0,
        start: int = 0,
        hashes: list[BlockHash] | None = None,
    ) -> None:
        self.children: dict[ChildKey, TreeNode] = {}
        self.parent = parent
        self.key = key
        self.value = value
        self.lock_ref = lock_ref
        self.last_access = last_access
        self.extra_key = extra_key
        self.id = node_id
        self.start = start  # position of key[0] in the sequence the path spells
        self.hashes: list[BlockHash] = hashes or []  # blocks ending in this edge (with a block size)

    def __repr__(self) -> str:
        return f"TreeNode(id={self.id}, len={len(self.key)}, lock_ref={self.lock_ref})"


class MatchResult(NamedTuple):
    """`indices`: KV slots of the longest cached prefix; `node`: the node ending exactly there."""

    indices: list[int]
    node: TreeNode


class RadixTree:
    """Token-prefix index with LRU eviction of unlocked leaves.

    Args:
        page_size: tokens per KV page; every stored key is a multiple of it.
        block_size: tokens per hashed block (a multiple of page_size); None: no block hashes.
        events: told about every block stored, removed and cleared (needs a block size).
    """

    def __init__(
        self, page_size: int = 1, block_size: int | None = None, events: BlockEventSink | None = None
    ) -> None:
        assert page_size >= 1, f"page_size must be >= 1, got {page_size}"
        assert block_size is None or block_size % page_size == 0, (block_size, page_size)
        assert events is None or block_size is not None, "block events need a block size"
        self.page_size = page_size
        self.block_size = block_size
        self.events = events
        self._ids = itertools.count()
        self._tick = 0
        self.reset()

    def reset(self) -> None:
        """Drop every node (their slots are forgotten: free them first if they matter)."""
        # NOTE: the root is pinned with lock_ref 1 and is never counted in the sizes.
        self.root = TreeNode((), [], None, None, next(self._ids), lock_ref=1)
        self._evictable = 0
        self._protected = 0

    @property
    def evictable_size(self) -> int:
        """Tokens in nodes no request locks (all of them can be evicted, leaves first)."""
        return self._evictable

    @property
    def protected_size(self) -> int:
        """Tokens in nodes locked by at least one request."""
        return self._protected

    @property
    def total_size(self) -> int:
        """Tokens stored in the tree."""
        return self._evictable + self._protected

    def _child_key(self, extra_key: str | None, key: Sequence[int], pos: int = 0) -> ChildKey:
        if self.page_size == 1:
            return (extra_key, key[pos])
        return (extra_key, tuple(key[pos : pos + self.page_size]))

    def _common_len(self, edge: tuple[int, ...], key: tuple[int, ...], pos: int) -> int:
        """Length of the common prefix of `edge` and `key[pos:]`, rounded down to whole pages."""
        n = min(len(edge), len(key) - pos)
        if edge[:n] == key[pos : pos + n]:
            return n - n % self.page_size
        i = 0
        while edge[i] == key[pos + i]:
            i += 1
        return i - i % self.page_size

    def _split(self, child: TreeNode, at: int) -> TreeNode:
        """Cut `child` after `at` tokens; returns the new upper node, which keeps the lock count."""
        parent = child.parent
        assert parent is not None and 0 < at < len(child.key)
        upper = TreeNode(
            child.key[:at],
            child.value[:at],
            parent,
            child.extra_key,
            next(self._ids),
            child.last_access,
            child.lock_ref,
            child.start,
        )
        if self.block_size is not None:
            cut = (child.start + at) // self.block_size - child.start // self.block_size
            upper.hashes, child.hashes = child.hashes[:cut], child.hashes[cut:]
        child.key, child.value, child.parent = child.key[at:], child.value[at:], upper
        child.start += at
        upper.children[self._child_key(child.extra_key, child.key)] = child
        parent.children[self._child_key(upper.extra_key, upper.key)] = upper
        return upper

    def _walk(self, key: tuple[int, ...], extra_key: str | None) -> tuple[TreeNode, int]:
        """Follow `key` from the root, splitting the last edge if the match ends inside it.

        Returns the deepest node matched and the matched length; touches every node on the way.
        """
        self._tick += 1
        node, pos = self.root, 0
        node.last_access = self._tick
        while pos < len(key):
            child = node.children.get(self._child_key(extra_key, key, pos))
            if child is None:
                break
            m = self._common_len(child.key, key, pos)
            if m == 0:
                break
            if m < len(child.key):
                child = self._split(child, m)
            child.last_access = self._tick
            node, pos = child, pos + m
        return node, pos

    def _aligned(self, key: Sequence[int]) -> tuple[int, ...]:
        return tuple(key[: len(key) - len(key) % self.page_size])

    def match_prefix(self, key: Sequence[int], extra_key: str | None = None) -> MatchResult:
        """Longest cached prefix of `key` (truncated to whole pages) under `extra_key`.

        May split a node so that the returned node covers exactly the matched prefix; locking
        that node then protects nothing more than the match. An empty match returns the root.
        """
        last, _ = self._walk(self._aligned(key), extra_key)
        values: list[list[int]] = []
        node = last
        while node.parent is not None:
            values.append(node.value)
            node = node.parent
        indices = [slot for value in reversed(values) for slot in value]
        return MatchResult(indices, last)

    def insert(
        self,
        key: Sequence[int],
        value: Sequence[int],
        extra_key: str | None = None,
        hashes: Sequence[BlockHash] = (),
    ) -> int:
        """Insert the page-aligned part of `key` -> `value`.

        `hashes`: with a block size, the hashes of key's whole blocks (at least those ending in
        its aligned part).

        Returns:
            How many leading tokens were already cached. The tree keeps its own slots for
            them; the caller still owns (and should free) its `value` entries in that range
            that it did not get from the tree. New nodes start unlocked (evictable).
        """
        assert len(key) == len(value), f"insert: len(key) {len(key)} != len(value) {len(value)}"
        k = self._aligned(key)
        node, pos = self._walk(k, extra_key)
        if pos < len(k):
            leaf_value = list(value[pos : len(k)])
            blocks = self._blocks(pos, len(k), hashes)
            leaf = TreeNode(k[pos:], leaf_value, node, extra_key, next(self._ids), self._tick, 0, pos, blocks)
            node.children[self._child_key(extra_key, leaf.key)] = leaf
            self._evictable += len(leaf.key)
            if self.events is not None and blocks:
                bs = self.block_size
                assert bs is not None, "events need a block size (checked in __init__)"
                first = pos // bs
                parent = hashes[first - 1] if first > 0 else None
                self.events.stored(blocks, parent, k[first * bs : (first + len(blocks)) * bs])
        return pos

    def _blocks(self, start: int, end: int, hashes: Sequence[BlockHash]) -> list[BlockHash]:
        """The hashes of the blocks ending in [start, end) (none without a block size)."""
        if self.block_size is None:
            return []
        ending = blocks_ending_in(start, end, self.block_size)
        assert len(hashes) >= ending.stop, f"insert up to {end} needs {ending.stop} block hashes, got {len(hashes)}"
        return list(hashes[ending.start : ending.stop])

    def lock(self, node: TreeNode) -> None:
        """Protect `node` and its ancestors from eviction (one more running user)."""
        while node.parent is not None:
            if node.lock_ref == 0:
                self._evictable -= len(node.key)
                self._protected += len(node.key)
            node.lock_ref += 1
            node = node.parent

    def unlock(self, node: TreeNode) -> None:
        """Undo one `lock(node)`; unlocking an unlocked node raises AssertionError."""
        while node.parent is not None:
            assert node.lock_ref > 0, f"unlock of {node!r} below zero"
            if node.lock_ref == 1:
                self._protected -= len(node.key)
                self._evictable += len(node.key)
            node.lock_ref -= 1
            node = node.parent

    def evict(self, num_tokens: int) -> list[int]:
        """Remove unlocked leaves, least recently used first, until `num_tokens` are freed.

        A parent that becomes an unlocked leaf joins the candidates. Stops early when nothing
        evictable is left. Returns the removed slots; the caller gives them to the allocator.
        """
        heap = [(n.last_access, n.id, n) for n in self._nodes() if self._evictable_leaf(n)]
        heapq.heapify(heap)
        freed: list[int] = []
        while len(freed) < num_tokens and heap:
            _, _, node = heapq.heappop(heap)
            parent = node.parent
            assert parent is not None and not node.children and node.lock_ref == 0
            del parent.children[self._child_key(node.extra_key, node.key)]
            self._evictable -= len(node.key)
            freed.extend(node.value)
            if self.events is not None and node.hashes:
                self.events.removed(node.hashes)
            if self._evictable_leaf(parent):
                heapq.heappush(heap, (parent.last_access, parent.id, parent))
        return freed

    def clear(self) -> list[int]:
        """Drop every node (none may be locked); returns their slots. One `cleared` event."""
        assert self._protected == 0, f"clear with {self._protected} protected tokens"
        slots = self.slots()
        self.reset()
        if self.events is not None:
            self.events.cleared()
        return slots

    @staticmethod
    def _evictable_leaf(node: TreeNode) -> bool:
        return node.parent is not None and not node.children and node.lock_ref == 0

    def _nodes(self) -> Iterator[TreeNode]:
        """Every node except the root, parents before children."""
        stack = list(self.root.children.values())
        while stack:
            node = stack.pop()
            yield node
            stack.extend(node.children.values())

    def slots(self) -> list[int]:
        """Every KV slot the tree holds."""
        return [slot for node in self._nodes() for slot in node.value]

    def check_integrity(self) -> None:
        """Walk the tree and assert its shape, lock counts and the incremental sizes."""
        root = self.root
        assert root.key == () and root.value == [] and root.lock_ref == 1, f"bad root {root!r}"
        evictable = protected = 0
        seen: set[int] = set()
        for node in self._nodes():
            self._check_node(node)
            if node.lock_ref > 0:
                protected += len(node.key)
            else:
                evictable += len(node.key)
            seen.update(node.value)
        assert evictable == self._evictable and protected == self._protected, (
            f"sizes: counted evictable {self._evictable} protected {self._protected}, "
            f"walked evictable {evictable} protected {protected}"
        )
        assert len(seen) == evictable + protected, (
            f"{evictable + protected} tokens but only {len(seen)} distinct slots"
        )

    def _check_node(self, node: TreeNode) -> None:
        parent, n, ps = node.parent, len(node.key), self.page_size
        assert parent is not None, f"{node!r} has no parent"
        assert n > 0 and n == len(node.value), f"{node!r}: key {n} value {len(node.value)}"
        assert n % ps == 0, f"{node!r}: key length {n} not a multiple of page_size {ps}"
        ck = self._child_key(node.extra_key, node.key)
        assert parent.children.get(ck) is node, f"{node!r} not under child key {ck} of its parent"
        assert node.lock_ref >= 0, f"{node!r}: negative lock_ref"
        assert node.start == parent.start + len(parent.key), f"{node!r}: start {node.start} after its parent's end"
        if self.block_size is not None:
            want = len(blocks_ending_in(node.start, node.start + n, self.block_size))
            assert len(node.hashes) == want, f"{node!r}: {len(node.hashes)} block hashes, {want} blocks end in it"
        if parent.parent is not None:
            assert parent.extra_key == node.extra_key, f"{node!r}: extra_key differs from parent"
            assert parent.lock_ref >= node.lock_ref, (
                f"{node!r}: lock_ref {node.lock_ref} > parent's {parent.lock_ref}"
            )
