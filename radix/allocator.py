"""KV slot allocator: which slots of the KV pool are free, handed out in whole pages.

Slot ids are ints in [0, num_slots). Page p owns slots p*page_size .. p*page_size + page_size - 1.
Page 0 (so slot 0) is padding: kernels may write there, so it is never handed out or freed.

    slots: | 0 .. ps-1 | ps .. 2ps-1 | 2ps .. 3ps-1 | ... | num_slots-ps .. num_slots-1 |
    pages: |  0 (pad)  |      1      |      2       | ... |       num_pages - 1         |

Stdlib only, so the scheduler's bookkeeping can be tested without torch.
"""

from __future__ import annotations

from collections.abc import Iterable


class KVAllocator:
    """Free-page bookkeeping for the KV pool.

    Args:
        num_slots: size of the KV pool in token slots, padding page included.
        page_size: tokens per page; `num_slots` must be a multiple of it.

    All counts this class reports (`total`, `available()`) are in token slots, not pages.
    """

    def __init__(self, num_slots: int, page_size: int = 1) -> None:
        assert page_size >= 1, f"page_size must be >= 1, got {page_size}"
        assert num_slots % page_size == 0, f"num_slots {num_slots} % page_size {page_size} != 0"
        assert num_slots >= page_size, f"num_slots {num_slots} < page_size {page_size}"
        self.num_slots = num_slots
        self.page_size = page_size
        self.num_pages = num_slots // page_size
        # NOTE: `_free` is a stack (pop from the end) of free page ids; `_is_free[p]` mirrors it
        # so a double free is caught in O(1). The two always describe the same set.
        self._free: list[int] = []
        self._is_free = bytearray(self.num_pages)
        self.clear()

    @property
    def total(self) -> int:
        """Usable token slots: everything except the padding page."""
        return self.num_slots - self.page_size

    def available(self) -> int:
        """Free token slots (a multiple of page_size)."""
        return len(self._free) * self.page_size

    def clear(self) -> None:
        """Mark every page except the padding page free; low page ids are handed out first."""
        self._free = list(range(self.num_pages - 1, 0, -1))
        self._is_free = bytearray(b"\x01") * self.num_pages
        self._is_free[0] = 0

    def alloc_pages(self, k: int) -> list[int] | None:
        """Take `k` free pages; returns their ids, or None (taking nothing) when fewer are free."""
        assert k >= 0, f"alloc_pages({k})"
        if k > len(self._free):
            return None
        if k == 0:
            return []
        pages = self._free[-k:]
        del self._free[-k:]
        pages.reverse()
        for p in pages:
            self._is_free[p] = 0
        return pages

    def alloc(self, n: int) -> list[int] | None:
        """Take `n` token slots (n a multiple of page_size) as n/page_size whole pages.

        Returns:
            The slots page by page, each page's slots consecutive; None (taking nothing) when
            fewer than `n` slots are free.
        """
        ps = self.page_size
        assert n >= 0 and n % ps == 0, f"alloc({n}) is not a multiple of page_size {ps}"
        pages = self.alloc_pages(n // ps)
        if pages is None:
            return None
        if ps == 1:
            return pages
        return [s for p in pages for s in range(p * ps, p * ps + ps)]

    def free(self, slots: Iterable[int]) -> None:
        """Return the pages that `slots` belong to.

        With page_size 1 each id frees its own slot, so an id repeated within one call is a
        double free. With page_size > 1 any slot of a page frees the whole page and a page named
        by several slots in one call is freed once. Freeing a page that is already free, the
        padding page, or an id out of range raises AssertionError; nothing is freed then.
        """
        ps = self.page_size
        slot_list = list(slots)
        pages = slot_list if ps == 1 else list(dict.fromkeys(s // ps for s in slot_list))
        if ps == 1:
            assert len(set(pages)) == len(pages), f"double free within one call: {slot_list}"
        for p in pages:
            assert 0 < p < self.num_pages, f"free of slot in page {p}: out of range or padding"
            assert not self._is_free[p], f"double free of page {p} (slot {p * ps})"
        for p in pages:
            self._is_free[p] = 1
        self._free.extend(pages)

    def is_free(self, slot: int) -> bool:
        """Whether the page holding `slot` is free."""
        return bool(self._is_free[slot // self.page_size])

    def check_integrity(self) -> None:
        """Assert the free stack and the free flags agree and hold only valid pages."""
        n_free, n_flags = len(self._free), sum(self._is_free)
        unique = set(self._free)
        assert len(unique) == n_free, f"duplicate free pages: {n_free} listed, {len(unique)} unique"
        bad = [p for p in unique if not 0 < p < self.num_pages]
        assert not bad, f"free pages out of range or padding: {bad[:10]} of {self.num_pages}"
        assert not self._is_free[0], "padding page 0 is marked free"
        assert n_flags == n_free, f"free flags {n_flags} != free list {n_free}"
        unflagged = [p for p in unique if not self._is_free[p]]
        assert not unflagged, f"pages on the free list but not flagged free: {unflagged[:10]}"
        assert self.available() <= self.total, f"available {self.available()} > total {self.total}"
