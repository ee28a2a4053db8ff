from __future__ import annotations

import random

import pytest

from radix.allocator import KVAllocator


def test_alloc_free_page_size_1() -> None:
    a = KVAllocator(10)
    assert a.total == 9 and a.available() == 9
    slots = a.alloc(3)
    assert slots == [1, 2, 3]
    assert a.available() == 6
    a.free(slots)
    assert a.available() == 9
    a.check_integrity()


def test_none_when_short_and_no_partial_alloc() -> None:
    a = KVAllocator(8)
    assert a.alloc(7) is not None
    assert a.alloc(1) is None
    a.clear()
    first = a.alloc(5)
    assert first is not None
    assert a.alloc(3) is None
    assert a.available() == 2
    assert a.alloc(2) is not None and a.available() == 0
    assert a.alloc(0) == []
    a.check_integrity()


def test_double_free_raises_and_frees_nothing() -> None:
    a = KVAllocator(8)
    slots = a.alloc(4)
    assert slots is not None
    a.free(slots[:2])
    with pytest.raises(AssertionError, match="double free"):
        a.free(slots)  # slots[2:] are still held: the failing call must not free them
    assert a.available() == 5
    with pytest.raises(AssertionError, match="double free"):
        a.free([slots[2], slots[2]])
    a.check_integrity()


def test_padding_and_out_of_range_rejected() -> None:
    a = KVAllocator(8, page_size=2)
    a.alloc(a.total)
    with pytest.raises(AssertionError):
        a.free([0])
    with pytest.raises(AssertionError):
        a.free([1])  # slot 1 is in padding page 0
    with pytest.raises(AssertionError):
        a.free([8])
    assert a.available() == 0


def test_page_mode() -> None:
    a = KVAllocator(16, page_size=4)
    assert a.total == 12 and a.num_pages == 4
    with pytest.raises(AssertionError):
        a.alloc(3)
    slots = a.alloc(8)
    assert slots == [4, 5, 6, 7, 8, 9, 10, 11]
    assert a.alloc_pages(2) is None
    assert a.alloc_pages(1) == [3]
    a.free([5])  # any slot frees its page
    assert a.available() == 4 and a.is_free(4) and a.is_free(7) and not a.is_free(8)
    a.free([8, 9, 10, 11, 9])  # one page named several times in one call counts once
    assert a.available() == 8
    with pytest.raises(AssertionError, match="double free"):
        a.free([6])
    a.check_integrity()


def test_constructor_checks() -> None:
    with pytest.raises(AssertionError):
        KVAllocator(10, page_size=4)
    with pytest.raises(AssertionError):
        KVAllocator(8, page_size=0)


def test_clear_hands_out_low_pages_first() -> None:
    a = KVAllocator(12, page_size=3)
    pages = a.alloc_pages(3)
    assert pages == [1, 2, 3]
    a.free([4, 10])
    a.clear()
    assert a.available() == 9
    assert a.alloc_pages(3) == [1, 2, 3]
    a.check_integrity()


def test_integrity_detects_corruption() -> None:
    a = KVAllocator(8)
    a._free.append(a._free[0])
    with pytest.raises(AssertionError, match="duplicate"):
        a.check_integrity()
    a.clear()
    a._is_free[0] = 1
    with pytest.raises(AssertionError):
        a.check_integrity()


@pytest.mark.parametrize("page_size", [1, 4])
def test_random_against_set_model(page_size: int) -> None:
    rng = random.Random(1234 + page_size)
    num_pages = 33
    a = KVAllocator(num_pages * page_size, page_size)
    free_pages = set(range(1, num_pages))
    held: list[list[int]] = []
    for _ in range(2000):
        op = rng.random()
        if op < 0.5:
            k = rng.randint(0, 8)
            got = a.alloc(k * page_size)
            if k > len(free_pages):
                assert got is None
            else:
                assert got is not None and len(got) == k * page_size
                pages = {s // page_size for s in got}
                assert len(pages) == k and pages <= free_pages
                free_pages -= pages
                held.append(got)
        elif op < 0.9 and held:
            got = held.pop(rng.randrange(len(held)))
            # Free any non-empty subset that touches every page: the page goes as a whole.
            part = [s for s in got if s % page_size == 0 or rng.random() < 0.5]
            rng.shuffle(part)
            a.free(part)
            free_pages |= {s // page_size for s in got}
        elif held and held[-1]:
            with pytest.raises(AssertionError):
                a.free(held[-1] + held[-1][:1] if page_size == 1 else [0] + held[-1])
        assert a.available() == len(free_pages) * page_size
        a.check_integrity()
