from __future__ import annotations

import random

import pytest

from radix.tree import RadixTree, TreeNode


def path_tokens(node: TreeNode) -> list[int]:
    """The token prefix a node's path spells."""
    parts = []
    while node.parent is not None:
        parts.append(node.key)
        node = node.parent
    return [t for key in reversed(parts) for t in key]


def test_empty_match_returns_root() -> None:
    t = RadixTree()
    assert t.match_prefix([]) == ([], t.root)
    assert t.match_prefix([1, 2]) == ([], t.root)
    t.insert([1, 2], [5, 6])
    assert t.match_prefix([]).node is t.root
    t.check_integrity()


def test_match_splits_node() -> None:
    t = RadixTree()
    assert t.insert([1, 2, 3, 4, 5], [11, 12, 13, 14, 15]) == 0
    m = t.match_prefix([1, 2, 3, 9])
    assert m.indices == [11, 12, 13]
    assert m.node.key == (1, 2, 3) and m.node.value == [11, 12, 13]
    (child,) = m.node.children.values()
    assert child.key == (4, 5) and child.value == [14, 15] and child.parent is m.node
    assert t.match_prefix([1, 2, 3, 4, 5, 6]).indices == [11, 12, 13, 14, 15]
    assert t.total_size == 5 and t.evictable_size == 5
    t.check_integrity()


def test_insert_returns_already_present_length() -> None:
    t = RadixTree()
    assert t.insert([1, 2, 3], [11, 12, 13]) == 0
    assert t.insert([1, 2, 3, 4], [21, 22, 23, 24]) == 3
    assert t.insert([1, 2, 9], [31, 32, 33]) == 2
    assert t.insert([1, 2, 3], [41, 42, 43]) == 3
    assert t.insert([], []) == 0
    # First inserted slots win; only the new suffixes were taken.
    assert t.match_prefix([1, 2, 3, 4]).indices == [11, 12, 13, 24]
    assert t.match_prefix([1, 2, 9]).indices == [11, 12, 33]
    assert t.total_size == 5
    with pytest.raises(AssertionError):
        t.insert([1, 2], [1])
    t.check_integrity()


def test_extra_key_isolation() -> None:
    t = RadixTree()
    t.insert([1, 2, 3], [11, 12, 13])
    assert t.insert([1, 2, 3], [21, 22, 23], extra_key="a") == 0
    assert t.match_prefix([1, 2, 3]).indices == [11, 12, 13]
    assert t.match_prefix([1, 2, 3], extra_key="a").indices == [21, 22, 23]
    assert t.match_prefix([1, 2, 3], extra_key="b").indices == []
    assert t.match_prefix([1, 2], extra_key="").indices == []
    assert t.total_size == 6 and len(t.root.children) == 2
    t.check_integrity()


def test_lock_unlock_sizes() -> None:
    t = RadixTree()
    t.insert([1, 2, 3, 4], [11, 12, 13, 14])
    m = t.match_prefix([1, 2])
    t.lock(m.node)
    assert (t.protected_size, t.evictable_size) == (2, 2)
    t.lock(m.node)
    t.unlock(m.node)
    assert (t.protected_size, t.evictable_size) == (2, 2)
    t.unlock(m.node)
    assert (t.protected_size, t.evictable_size) == (0, 4)
    with pytest.raises(AssertionError, match="below zero"):
        t.unlock(m.node)
    t.lock(t.root)
    t.unlock(t.root)
    assert t.root.lock_ref == 1
    t.check_integrity()


def test_split_copies_lock_ref() -> None:
    t = RadixTree()
    t.insert([1, 2, 3, 4], [11, 12, 13, 14])
    whole = t.match_prefix([1, 2, 3, 4]).node
    t.lock(whole)
    upper = t.match_prefix([1, 2]).node
    assert upper.lock_ref == 1 and whole.parent is upper
    assert t.protected_size == 4
    t.check_integrity()
    t.unlock(whole)
    assert t.protected_size == 0 and upper.lock_ref == 0
    t.check_integrity()


def test_lru_eviction_order_and_cascade() -> None:
    t = RadixTree()
    t.insert([1, 2], [11, 12])
    t.insert([3, 4], [13, 14])
    t.insert([5, 6], [15, 16])
    t.match_prefix([1, 2])  # touch: [3, 4] is now least recently used
    assert t.evict(1) == [13, 14]
    assert t.evict(2) == [15, 16]
    assert t.evict(10) == [11, 12]
    assert t.total_size == 0
    t.insert([1, 2, 3], [21, 22, 23])
    t.insert([1, 2, 4], [21, 22, 24])
    t.match_prefix([1, 2, 4])
    # The leaf [3] goes first, then [4]; then [1, 2] has become a leaf and cascades.
    assert t.evict(5) == [23, 24, 21, 22]
    assert t.evict(1) == []
    t.check_integrity()


def test_locked_nodes_never_evicted() -> None:
    t = RadixTree()
    t.insert([1, 2, 3], [11, 12, 13])
    t.insert([1, 2, 4, 5], [11, 12, 14, 15])
    t.insert([7], [17])
    node = t.match_prefix([1, 2, 3]).node
    t.lock(node)
    freed = t.evict(100)
    assert sorted(freed) == [14, 15, 17]
    assert t.evictable_size == 0 and t.protected_size == 3
    assert t.match_prefix([1, 2, 3]).indices == [11, 12, 13]
    t.unlock(node)
    assert sorted(t.evict(100)) == [11, 12, 13]
    t.check_integrity()


def test_page_size_4_alignment() -> None:
    t = RadixTree(page_size=4)
    key = list(range(10))
    assert t.insert(key, [100 + i for i in key]) == 0
    assert t.total_size == 8  # the unaligned tail is not inserted
    assert t.match_prefix(key[:7]).indices == [100, 101, 102, 103]
    assert t.match_prefix([0, 1, 2]).indices == []
    # A mismatch inside the second page matches only the first page, splitting there.
    m = t.match_prefix([0, 1, 2, 3, 4, 5, 99, 7])
    assert m.indices == [100, 101, 102, 103] and m.node.key == (0, 1, 2, 3)
    assert t.insert([0, 1, 2, 3, 4, 5, 9, 9], [1, 1, 1, 1, 50, 51, 52, 53]) == 4
    assert t.match_prefix([0, 1, 2, 3, 4, 5, 9, 9]).indices == [100, 101, 102, 103, 50, 51, 52, 53]
    assert len(m.node.children) == 2 and t.total_size == 12
    assert sorted(t.evict(1)) in ([104, 105, 106, 107], [50, 51, 52, 53])
    t.check_integrity()


def test_reset() -> None:
    t = RadixTree()
    t.insert([1, 2], [3, 4])
    t.reset()
    assert t.total_size == 0 and t.match_prefix([1, 2]).indices == []
    t.check_integrity()


def test_integrity_detects_bad_sizes() -> None:
    t = RadixTree()
    t.insert([1, 2], [3, 4])
    t._evictable += 1
    with pytest.raises(AssertionError, match="evictable"):
        t.check_integrity()


# ---- randomized operations against a naive reference ----------------------------------------
# The reference stores one entry per cached page: (extra_key, tokens up to the end of that page)
# -> that page's slots, plus a lock count per entry. The cached set is prefix closed.

PageKey = tuple[str | None, tuple[int, ...]]


class Reference:
    def __init__(self, page_size: int) -> None:
        self.ps = page_size
        self.pages: dict[PageKey, tuple[int, ...]] = {}
        self.locks: dict[PageKey, int] = {}

    def page_keys(self, seq: list[int], extra: str | None) -> list[PageKey]:
        n = len(seq) - len(seq) % self.ps
        return [(extra, tuple(seq[: i + self.ps])) for i in range(0, n, self.ps)]

    def match(self, seq: list[int], extra: str | None) -> list[PageKey]:
        keys = []
        for k in self.page_keys(seq, extra):
            if k not in self.pages:
                break
            keys.append(k)
        return keys

    def insert(self, seq: list[int], vals: list[int], extra: str | None) -> int:
        present = len(self.match(seq, extra))
        for i, k in enumerate(self.page_keys(seq, extra)[present:], start=present):
            self.pages[k] = tuple(vals[i * self.ps : (i + 1) * self.ps])
        return present * self.ps

    def protected(self) -> int:
        return self.ps * sum(1 for c in self.locks.values() if c > 0)


def tree_pages(t: RadixTree) -> dict[PageKey, tuple[int, ...]]:
    out: dict[PageKey, tuple[int, ...]] = {}
    stack: list[tuple[TreeNode, tuple[int, ...]]] = [(c, ()) for c in t.root.children.values()]
    while stack:
        node, prefix = stack.pop()
        for i in range(0, len(node.key), t.page_size):
            out[(node.extra_key, prefix + node.key[: i + t.page_size])] = tuple(
                node.value[i : i + t.page_size]
            )
        stack.extend((c, prefix + node.key) for c in node.children.values())
    return out


def evict_and_check(t: RadixTree, ref: Reference, num: int) -> None:
    freed = t.evict(num)
    assert len(set(freed)) == len(freed)
    gone = {k for k, v in ref.pages.items() if set(v) & set(freed)}
    assert sum(len(ref.pages[k]) for k in gone) == len(freed)
    assert all(ref.locks.get(k, 0) == 0 for k in gone), "evicted a locked page"
    for k in gone:
        del ref.pages[k]
    assert len(freed) >= num or t.evictable_size == 0


def run_random_ops(page_size: int, steps: int, seed: int) -> None:
    rng = random.Random(seed)
    t, ref = RadixTree(page_size), Reference(page_size)
    next_slot = 1
    held: list[tuple[TreeNode, list[PageKey]]] = []

    # Prefixes of a few base sequences plus random tails, so that paths collide for any page size.
    bases = [[rng.randint(0, 2) for _ in range(6 * page_size)] for _ in range(4)]

    def rand_seq() -> list[int]:
        head = rng.choice(bases)[: rng.randint(0, 6 * page_size)] if rng.random() < 0.7 else []
        return head + [rng.randint(0, 2) for _ in range(rng.randint(0, 2 * page_size))]

    for step in range(steps):
        op = rng.random()
        extra = rng.choice([None, None, "x"])
        if op < 0.4:
            seq = rand_seq()
            vals = list(range(next_slot, next_slot + len(seq)))
            next_slot += len(seq)
            assert t.insert(seq, vals, extra) == ref.insert(seq, vals, extra)
        elif op < 0.78:
            seq = rand_seq()
            m, keys = t.match_prefix(seq, extra), ref.match(seq, extra)
            assert m.indices == [s for k in keys for s in ref.pages[k]]
            assert path_tokens(m.node) == seq[: len(m.indices)]
            assert m.node.extra_key == (extra if keys else None)
            if len(held) < 8 and rng.random() < 0.4:
                t.lock(m.node)
                held.append((m.node, keys))
                for k in keys:
                    ref.locks[k] = ref.locks.get(k, 0) + 1
        elif op < 0.92 and held:
            node, keys = held.pop(rng.randrange(len(held)))
            t.unlock(node)
            for k in keys:
                ref.locks[k] -= 1
        else:
            evict_and_check(t, ref, rng.randint(0, 6 * page_size))
        if t.total_size > 300:
            evict_and_check(t, ref, t.total_size - 200)
        t.check_integrity()
        assert t.total_size == page_size * len(ref.pages)
        assert t.protected_size == ref.protected()
        if step % 25 == 0 or step == steps - 1:
            assert tree_pages(t) == ref.pages


@pytest.mark.parametrize("page_size", [1, 4])
def test_random_ops_against_reference(page_size: int) -> None:
    run_random_ops(page_size, steps=3000, seed=7 + page_size)
