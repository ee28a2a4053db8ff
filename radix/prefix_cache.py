"""The prefix cache: a RadixTree plus the KVAllocator, and the request-level KV hand-over.

The scheduler keeps, per request, `kv` (the KV slot of every token it has computed, in order),
`prefix_len` (how many leading entries of `kv` the tree owns, locked through `node`) and `node`.
Ownership of a request's slots:

    kv: [0, prefix_len)          tree-owned, protected by lock(node); never freed by the request
        [prefix_len, len(kv))    request-owned: freed or handed to the tree by cache_* / release

With page_size > 1, `prefix_len` is a multiple of page_size and the request owns whole pages:
kv[prefix_len:] fills pages in order, and its last page may be partly used. The caller must
take new slots with `alloc_extend(kv, n)`, which continues that partial page (slot kv[-1] + 1)
before taking whole new pages; `alloc(n)` alone hands out whole pages only.

Invariant (`check_integrity`): allocator.available() + evictable + protected + slots held by
requests == total, where a request holds `owned_slots(len(kv), prefix_len)` slots.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Sequence
from typing import NamedTuple

from radix.allocator import KVAllocator
from radix.blocks import BlockEventSink, BlockHash, BlockHasher
from radix.tree import MatchResult, RadixTree, TreeNode


class CacheUpdate(NamedTuple):
    """A continuing request's new state: write `kv` back to its slot row, keep `node` locked."""

    kv: list[int]
    prefix_len: int
    node: TreeNode


class BasePrefixCache(ABC):
    """Allocator-facing parts shared by the radix and the no-cache variants.

    Args:
        allocator: the KV slot allocator; the cache frees evicted slots into it.
        page_size: must equal `allocator.page_size`.
    """

    def __init__(self, allocator: KVAllocator, page_size: int, hasher: BlockHasher | None = None) -> None:
        assert page_size == allocator.page_size, f"page_size {page_size} != {allocator.page_size}"
        self.allocator = allocator
        self.page_size = page_size
        self.hasher = hasher  # None: blocks are not hashed (no tier, no KV events)
        self.evicted_tokens = 0  # cached tokens evicted to make room (not counting flushes)

    @property
    def total(self) -> int:
        """Usable KV slots."""
        return self.allocator.total

    def available(self) -> int:
        """Free KV slots, not counting what eviction could reclaim."""
        return self.allocator.available()

    @property
    @abstractmethod
    def evictable_size(self) -> int:
        """Cached tokens no request locks (reclaimable by `alloc`)."""

    @property
    @abstractmethod
    def protected_size(self) -> int:
        """Cached tokens locked by running requests."""

    def free(self, slots: Iterable[int]) -> None:
        """Give request-owned slots back to the allocator."""
        self.allocator.free(slots)

    def alloc(self, n: int) -> list[int] | None:
        """Take `n` slots (a multiple of page_size), evicting cached tokens if needed.

        Returns None, having neither taken nor evicted anything, when even a full eviction
        would not free enough.
        """
        short = n - self.allocator.available()
        if short > 0:
            if short > self.evictable_size:
                return None
            self._evict(short)
        return self.allocator.alloc(n)

    def alloc_extend(self, kv: Sequence[int], n: int) -> list[int] | None:
        """Slots for the next `n` tokens of a request whose slots so far are `kv`.

        The rest of its partly used last page comes first, then whole new pages (their unused
        slots stay owned by the request through the page). None when out of memory.
        """
        ps = self.page_size
        room = (ps - len(kv) % ps) % ps if kv else 0
        own = min(room, n)
        start = kv[-1] + 1 if own else 0
        need = n - own
        pages = self.alloc(-(-need // ps) * ps)
        if pages is None:
            return None
        return list(range(start, start + own)) + pages[:need]

    def owned_slots(self, kv_len: int, prefix_len: int) -> int:
        """Slots a request with `kv_len` computed tokens holds beyond its cached prefix."""
        own = kv_len - prefix_len
        return -(-own // self.page_size) * self.page_size

    def _evict(self, num_tokens: int) -> None:
        """Evict at least `num_tokens` cached tokens into the allocator.

        `alloc` calls it only when evictable_size covers the shortfall, so a cache without a
        tree (evictable_size 0) never gets here.
        """
        raise NotImplementedError

    @abstractmethod
    def match(self, tokens: Sequence[int], extra_key: str | None = None) -> MatchResult:
        """Longest cached prefix of `tokens`, page aligned; takes no lock.

        The caller should pass at most len(prompt) - 1 tokens so one token is left to compute.
        """

    @abstractmethod
    def lock(self, node: TreeNode) -> None:
        """Protect the prefix ending at `node` while a request uses it."""

    @abstractmethod
    def unlock(self, node: TreeNode) -> None:
        """Undo one `lock(node)`."""

    def cache_finished(
        self,
        tokens: Sequence[int],
        kv: Sequence[int],
        prefix_len: int,
        node: TreeNode,
        extra_key: str | None = None,
        hashes: list[BlockHash] | None = None,
    ) -> None:
        """A finished request hands over all its KV and drops its lock.

        Args:
            tokens: prompt + output[:-1] (the last output token has no KV).
            kv: one slot per token, `len(kv) == len(tokens)`.
            prefix_len, node: the request's cached prefix and its locked node.
            hashes: the request's block hashes so far, extended here (see `block_hashes`).
        """
        cached = self._publish(tokens, kv, prefix_len, extra_key, self.block_hashes(tokens, extra_key, hashes))
        self.free(kv[cached:])
        self.unlock(node)

    def block_hashes(
        self, tokens: Sequence[int], extra_key: str | None, hashes: list[BlockHash] | None = None
    ) -> list[BlockHash]:
        """`hashes` (a request's hashes of an earlier, shorter `tokens`; None: none yet) extended
        to every whole block of `tokens`; [] when blocks are not hashed."""
        if self.hasher is None:
            return []
        return self.hasher.extend([] if hashes is None else hashes, tokens, extra_key)

    @abstractmethod
    def _publish(
        self,
        tokens: Sequence[int],
        kv: Sequence[int],
        prefix_len: int,
        extra_key: str | None,
        hashes: Sequence[BlockHash],
    ) -> int:
        """Hand the cache what it keeps of kv[prefix_len:] and free what it refuses.

        Returns:
            How many leading entries of `kv` the cache owns now; the rest stays the caller's.
        """

    def cache_unfinished(
        self,
        tokens: Sequence[int],
        kv: Sequence[int],
        prefix_len: int,
        node: TreeNode,
        extra_key: str | None = None,
        hashes: list[BlockHash] | None = None,
    ) -> CacheUpdate:
        """A continuing request publishes what it has computed so far (`len(kv) == len(tokens)`).

        Returns the request's new kv / prefix_len / node; the caller writes `kv` back into its
        slot row (entries [old prefix_len, new prefix_len) may now point at other slots).
        """
        cached = self._publish(tokens, kv, prefix_len, extra_key, self.block_hashes(tokens, extra_key, hashes))
        new = self.match(tokens[:cached], extra_key)
        assert len(new.indices) == cached, f"re-match {len(new.indices)} != cached {cached}"
        # Lock before unlocking so the shared path never drops to lock_ref 0 in between.
        self.lock(new.node)
        self.unlock(node)
        return CacheUpdate(new.indices + list(kv[cached:]), cached, new.node)

    @abstractmethod
    def flush(self) -> bool:
        """Drop every cached token (no request may be running); returns True."""

    def release(self, kv: Sequence[int], prefix_len: int, node: TreeNode) -> None:
        """Abort or retract without caching: free the request's own slots, drop its lock."""
        self.free(kv[prefix_len:])
        self.unlock(node)

    def check_integrity(self, held_by_requests: int = 0) -> None:
        """Assert available + evictable + protected + held_by_requests == total.

        Args:
            held_by_requests: sum of `owned_slots(...)` over running requests.
        """
        self.allocator.check_integrity()
        self.check_counts(held_by_requests)

    def check_counts(self, held_by_requests: int = 0) -> None:
        """The equation of `check_integrity` alone, from the O(1) counters (the allocator's free
        count, the tree's incremental sizes): cheap enough for every state poll."""
        avail, total = self.available(), self.total
        ev, prot = self.evictable_size, self.protected_size
        assert avail + ev + prot + held_by_requests == total, (
            f"KV leak: available {avail} + evictable {ev} + protected {prot} + held by requests "
            f"{held_by_requests} = {avail + ev + prot + held_by_requests} != total {total}"
        )

    def check_idle_integrity(self, pinned: int = 0) -> None:
        """With no request running: nothing locked but the `pinned` tokens, and
        available + evictable + pinned == total."""
        assert self.protected_size == pinned, f"idle but protected {self.protected_size} != pinned {pinned}"
        self.check_integrity(0)


class RadixPrefixCache(BasePrefixCache):
    """Prefix reuse through a RadixTree with LRU eviction."""

    def __init__(
        self,
        allocator: KVAllocator,
        page_size: int,
        hasher: BlockHasher | None = None,
        events: BlockEventSink | None = None,
    ) -> None:
        super().__init__(allocator, page_size, hasher)
        self.tree = RadixTree(page_size, None if hasher is None else hasher.block_size, events)

    @property
    def evictable_size(self) -> int:
        return self.tree.evictable_size

    @property
    def protected_size(self) -> int:
        return self.tree.protected_size

    def _evict(self, num_tokens: int) -> None:
        freed = self.tree.evict(num_tokens)
        self.evicted_tokens += len(freed)
        self.allocator.free(freed)

    def match(self, tokens: Sequence[int], extra_key: str | None = None) -> MatchResult:
        return self.tree.match_prefix(tokens, extra_key)

    def lock(self, node: TreeNode) -> None:
        self.tree.lock(node)

    def unlock(self, node: TreeNode) -> None:
        self.tree.unlock(node)

    def _publish(
        self,
        tokens: Sequence[int],
        kv: Sequence[int],
        prefix_len: int,
        extra_key: str | None,
        hashes: Sequence[BlockHash],
    ) -> int:
        """Insert the aligned part and free the request's duplicates; returns the aligned length.

        kv: |  tree's (locked)  |   duplicates: free   |  newly inserted  | unaligned tail |
            0              prefix_len             present           aligned          len(kv)

        [prefix_len, present) was computed by this request, but another request inserted the
        same tokens meanwhile: the tree keeps its slots, ours would leak unless freed here.
        [present, aligned) now belongs to the tree. The tail stays with the caller.
        """
        assert len(kv) == len(tokens), f"len(kv) {len(kv)} != len(tokens) {len(tokens)}"
        assert prefix_len % self.page_size == 0, f"prefix_len {prefix_len} not page aligned"
        aligned = len(tokens) - len(tokens) % self.page_size
        present = self.tree.insert(tokens[:aligned], kv[:aligned], extra_key, hashes)
        # NOTE: the locked prefix cannot have been evicted, so the insert re-finds all of it.
        assert present >= prefix_len, f"insert found {present} < locked prefix {prefix_len}"
        self.free(kv[prefix_len:present])
        return aligned

    def flush(self) -> bool:
        prot = self.tree.protected_size
        assert prot == 0, f"flush with {prot} protected tokens: requests still hold the cache"
        self.allocator.free(self.tree.clear())
        return True

    def check_integrity(self, held_by_requests: int = 0) -> None:
        """Tree and allocator integrity, no cached slot free or padding, and the equation."""
        self.tree.check_integrity()
        bad = [s for s in self.tree.slots() if s < self.page_size or self.allocator.is_free(s)]
        assert not bad, f"cached slots that are free or padding: {bad[:10]}"
        if self.hasher is not None:
            self._check_hashes(self.hasher)
        super().check_integrity(held_by_requests)

    def _check_hashes(self, hasher: BlockHasher) -> None:
        """Every node's block hashes are those of the tokens its path spells."""
        stack: list[tuple[TreeNode, tuple[int, ...], list[BlockHash]]] = [
            (child, (), []) for child in self.tree.root.children.values()
        ]
        while stack:
            node, before, hashes = stack.pop()
            tokens = before + node.key
            path_hashes = hasher.extend(list(hashes), tokens, node.extra_key)
            assert node.hashes == path_hashes[len(hashes) :], f"{node!r}: block hashes differ from its tokens'"
            stack.extend((child, tokens, path_hashes) for child in node.children.values())


class NoPrefixCache(BasePrefixCache):
    """`--disable-radix-cache`: nothing is shared; every request owns all its slots."""

    def __init__(self, allocator: KVAllocator, page_size: int) -> None:
        super().__init__(allocator, page_size)
        # A stand-in node so callers can lock/unlock uniformly; it is never part of a tree.
        self._root = RadixTree(page_size).root

    @property
    def evictable_size(self) -> int:
        return 0

    @property
    def protected_size(self) -> int:
        return 0

    def match(self, tokens: Sequence[int], extra_key: str | None = None) -> MatchResult:
        return MatchResult([], self._root)

    def lock(self, node: TreeNode) -> None:
        pass

    def unlock(self, node: TreeNode) -> None:
        pass

    def _publish(
        self,
        tokens: Sequence[int],
        kv: Sequence[int],
        prefix_len: int,
        extra_key: str | None,
        hashes: Sequence[BlockHash],
    ) -> int:
        assert prefix_len == 0, f"no-cache request with prefix_len {prefix_len}"
        assert len(kv) == len(tokens), f"len(kv) {len(kv)} != len(tokens) {len(tokens)}"
        return 0

    def flush(self) -> bool:
        return True


def make_prefix_cache(
    allocator: KVAllocator,
    page_size: int,
    disable_radix_cache: bool = False,
    hasher: BlockHasher | None = None,
    events: BlockEventSink | None = None,
) -> BasePrefixCache:
    """The radix cache (hashing blocks with `hasher`, telling `events`), or the no-cache
    variant when `disable_radix_cache` is set."""
    if disable_radix_cache:
        return NoPrefixCache(allocator, page_size)
    return RadixPrefixCache(allocator, page_size, hasher, events)
