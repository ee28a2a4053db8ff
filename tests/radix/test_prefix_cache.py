from __future__ import annotations

import random
from dataclasses import dataclass, field

import pytest

from radix.allocator import KVAllocator
from radix.prefix_cache import BasePrefixCache, NoPrefixCache, RadixPrefixCache, make_prefix_cache
from radix.tree import TreeNode


@dataclass
class Req:
    """What the scheduler keeps per request: tokens with KV, their slots, the locked prefix."""

    prompt: list[int]
    node: TreeNode
    kv: list[int]
    prefix_len: int
    extra: str | None = None
    tokens: list[int] = field(default_factory=list)


class Harness:
    """Drives request lifecycles and checks the integrity equation after every step."""

    def __init__(self, num_slots: int, page_size: int, disable: bool = False) -> None:
        self.cache = make_prefix_cache(KVAllocator(num_slots, page_size), page_size, disable)
        self.reqs: list[Req] = []
        # slot -> (extra_key, the tokens up to and including the one whose KV it holds)
        self.content: dict[int, tuple[str | None, tuple[int, ...]]] = {}

    def check(self) -> None:
        c = self.cache
        held = sum(c.owned_slots(len(r.kv), r.prefix_len) for r in self.reqs)
        c.check_integrity(held)
        pages: list[int] = [s // c.page_size for r in self.reqs for s in r.kv[r.prefix_len :]]
        owned = set(pages)
        assert not any(c.allocator.is_free(p * c.page_size) for p in owned)
        if isinstance(c, RadixPrefixCache):
            assert not owned & {s // c.page_size for s in c.tree.slots()}
        for r in self.reqs:
            self.check_content(r.kv, r.tokens, r.extra)
        if not self.reqs:
            c.check_idle_integrity()

    def check_content(self, kv: list[int], tokens: list[int], extra: str | None) -> None:
        assert len(kv) == len(tokens)
        for i, slot in enumerate(kv):
            assert self.content[slot] == (extra, tuple(tokens[: i + 1])), f"slot {slot} at {i}"

    def admit(self, prompt: list[int], extra: str | None = None) -> Req:
        m = self.cache.match(prompt[:-1], extra)
        self.cache.lock(m.node)
        n = len(m.indices)
        req = Req(prompt, m.node, list(m.indices), n, extra, prompt[:n])
        self.check_content(req.kv, req.tokens, extra)
        self.reqs.append(req)
        self.check()
        return req

    def compute(self, req: Req, new_tokens: list[int]) -> bool:
        """Allocate KV for `new_tokens` and 'run' them; False when out of memory."""
        slots = self.cache.alloc_extend(req.kv, len(new_tokens))
        if slots is None:
            return False
        assert len(slots) == len(new_tokens)
        for tok, slot in zip(new_tokens, slots, strict=True):
            req.tokens.append(tok)
            req.kv.append(slot)
            self.content[slot] = (req.extra, tuple(req.tokens))
        self.check()
        return True

    def prefill(self, req: Req) -> bool:
        return self.compute(req, req.prompt[len(req.kv) :])

    def unfinished(self, req: Req) -> None:
        upd = self.cache.cache_unfinished(req.tokens, req.kv, req.prefix_len, req.node, req.extra)
        assert len(upd.kv) == len(req.kv)
        req.kv, req.prefix_len, req.node = upd.kv, upd.prefix_len, upd.node
        self.check()

    def finish(self, req: Req) -> None:
        self.reqs.remove(req)
        self.cache.cache_finished(req.tokens, req.kv, req.prefix_len, req.node, req.extra)
        self.check()

    def abort(self, req: Req) -> None:
        self.reqs.remove(req)
        self.cache.release(req.kv, req.prefix_len, req.node)
        self.check()


def test_single_request_lifecycle() -> None:
    h = Harness(64, 1)
    r = h.admit([1, 2, 3, 4, 5])
    assert r.prefix_len == 0 and h.prefill(r)
    h.unfinished(r)
    assert r.prefix_len == 5 and h.cache.protected_size == 5
    for tok in (6, 7, 8):
        assert h.compute(r, [tok])
    h.finish(r)
    assert h.cache.evictable_size == 8 and h.cache.available() == 63 - 8
    r2 = h.admit([1, 2, 3, 4, 5, 6, 7, 8, 9])
    assert r2.prefix_len == 8 and h.prefill(r2)
    h.finish(r2)
    assert h.cache.evictable_size == 9


def test_shared_prefix_second_finishes_first_frees_duplicates() -> None:
    h = Harness(64, 1)
    shared = [7, 7, 7, 7, 7, 7]
    r1, r2 = h.admit(shared + [1]), h.admit(shared + [2])
    assert h.prefill(r1) and h.prefill(r2) and h.compute(r1, [3]) and h.compute(r2, [4])
    assert h.cache.available() == 63 - 16
    h.finish(r2)
    assert h.cache.evictable_size == 8
    h.finish(r1)  # its copy of `shared` duplicates r2's and is freed
    assert h.cache.evictable_size == 8 + 2 and h.cache.available() == 63 - 10


def test_unfinished_repoints_to_canonical_slots() -> None:
    h = Harness(64, 1)
    r1, r2 = h.admit([5, 6, 7, 8, 1]), h.admit([5, 6, 7, 8, 2])
    assert h.prefill(r1) and h.prefill(r2)
    h.unfinished(r2)
    old = list(r1.kv)
    h.unfinished(r1)
    assert r1.kv[:4] == r2.kv[:4] and r1.kv[4] == old[4] and r1.prefix_len == 5
    assert h.cache.protected_size == 6 and h.cache.available() == 63 - 6
    h.abort(r2)
    h.finish(r1)


def test_chunked_prefill_and_abort_paths() -> None:
    h = Harness(64, 1)
    prompt = list(range(1, 13))
    r = h.admit(prompt)
    for lo in (0, 4, 8):
        assert h.compute(r, prompt[lo : lo + 4])
        h.unfinished(r)
    assert r.prefix_len == 12
    h.abort(r)  # retract after caching: the tree keeps the prompt
    assert h.cache.evictable_size == 12
    r = h.admit(prompt + [99])
    assert r.prefix_len == 12
    h.abort(r)  # aborted while waiting: only the lock is dropped
    r = h.admit([1, 2, 50, 51])
    assert r.prefix_len == 2 and h.prefill(r)
    h.abort(r)  # aborted mid-run: its own slots go back
    assert h.cache.evictable_size == 12 and h.cache.available() == 63 - 12


def test_alloc_evicts_and_fails_cleanly() -> None:
    h = Harness(17, 1)  # 16 usable slots
    r = h.admit(list(range(1, 13)))
    assert h.prefill(r)
    h.finish(r)
    assert h.cache.available() == 4 and h.cache.evictable_size == 12
    locked = h.admit(list(range(1, 7)) + [0])  # locks 6 cached tokens
    assert h.cache.alloc(11) is None  # 4 free + 6 evictable < 11: nothing may be evicted
    assert h.cache.evictable_size == 6 and h.cache.available() == 4
    slots = h.cache.alloc(10)
    assert slots is not None and h.cache.evictable_size == 0
    h.cache.free(slots)
    h.abort(locked)


def test_flush() -> None:
    h = Harness(64, 1)
    r = h.admit([1, 2, 3, 4])
    assert h.prefill(r)
    h.unfinished(r)
    with pytest.raises(AssertionError, match="protected"):
        h.cache.flush()
    h.finish(r)
    assert h.cache.flush() is True
    assert h.cache.available() == h.cache.total and h.cache.evictable_size == 0
    assert h.cache.match([1, 2, 3, 4]).indices == []
    h.check()


def test_integrity_reports_leak() -> None:
    h = Harness(64, 1)
    h.cache.alloc(3)
    with pytest.raises(AssertionError, match="available 60 .* total 63"):
        h.cache.check_idle_integrity()
    h.cache.check_integrity(held_by_requests=3)


def test_no_cache_lifecycle() -> None:
    h = Harness(64, 1, disable=True)
    assert isinstance(h.cache, NoPrefixCache)
    r1, r2 = h.admit([1, 2, 3, 4]), h.admit([1, 2, 3, 4])
    assert r1.prefix_len == r2.prefix_len == 0
    assert h.prefill(r1) and h.prefill(r2)
    h.unfinished(r1)
    assert r1.prefix_len == 0 and h.cache.available() == 63 - 8
    assert h.compute(r1, [5])
    h.finish(r1)
    h.abort(r2)
    assert h.cache.available() == 63 and h.cache.flush()


def test_page_size_4() -> None:
    h = Harness(64, 4)  # 15 usable pages
    assert isinstance(h.cache, RadixPrefixCache)
    r1 = h.admit(list(range(1, 11)))  # 10 tokens: pages [1-4] [5-8] [9 10 _ _]
    assert h.prefill(r1)
    assert h.cache.available() == 60 - 12 and r1.kv[9] == r1.kv[8] + 1
    h.unfinished(r1)
    assert r1.prefix_len == 8 and h.cache.protected_size == 8
    assert h.compute(r1, [11, 12]) and h.cache.available() == 48  # fills the partial page
    assert h.compute(r1, [13]) and h.cache.available() == 44  # crosses into a new page
    r2 = h.admit(list(range(1, 11)) + [77])
    assert r2.prefix_len == 8 and h.prefill(r2)
    h.finish(r2)  # nothing new to insert: its only new tokens sit on a partial page, freed
    assert h.cache.evictable_size == 0 and h.cache.protected_size == 8
    h.finish(r1)  # 13 tokens: pages up to 12 are inserted, the page holding 13 is freed
    assert h.cache.evictable_size == 12 and h.cache.available() == 48
    assert h.cache.match(list(range(1, 14))).indices == r1.kv[:12]


def test_page_size_4_duplicates_and_no_cache() -> None:
    h = Harness(64, 4)
    shared = list(range(1, 9))
    r1, r2 = h.admit(shared + [1, 1, 1, 1, 1]), h.admit(shared + [2, 2, 2, 2, 2])
    assert h.prefill(r1) and h.prefill(r2)
    h.finish(r2)
    h.finish(r1)
    assert h.cache.evictable_size == 16 and h.cache.available() == 60 - 16
    n = Harness(64, 4, disable=True)
    r = n.admit(shared + [3])
    assert n.prefill(r) and n.compute(r, [4, 5, 6, 7]) and n.cache.available() == 60 - 16
    n.finish(r)


def test_page_size_mismatch_rejected() -> None:
    with pytest.raises(AssertionError):
        RadixPrefixCache(KVAllocator(64, 4), 1)
    assert isinstance(make_prefix_cache(KVAllocator(64, 4), 4), BasePrefixCache)


def run_random_workload(page_size: int, disable: bool, steps: int, seed: int) -> None:
    rng = random.Random(seed)
    h = Harness(14 * page_size if page_size > 1 else 48, page_size, disable)  # tight: OOM happens
    bases = [[rng.randint(1, 3) for _ in range(24)] for _ in range(3)]
    done: dict[int, int] = {}  # id(req) -> output tokens still to generate
    for _ in range(steps):
        op = rng.random()
        if op < 0.2 and len(h.reqs) < 4:
            head = rng.choice(bases)[: rng.randint(0, 20)]
            prompt = head + [rng.randint(1, 3) for _ in range(rng.randint(1, 6))]
            req = h.admit(prompt, rng.choice([None, "salt"]))
            done[id(req)] = rng.randint(1, 8)
        elif h.reqs:
            step_request(h, rng.choice(h.reqs), rng, done)
    for req in list(h.reqs):
        if rng.random() < 0.5:
            h.finish(req)
        else:
            h.abort(req)
    h.check()
    assert h.cache.flush() and h.cache.available() == h.cache.total


def step_request(h: Harness, req: Req, rng: random.Random, done: dict[int, int]) -> None:
    """Advance one request: a prefill chunk, a decode token, an abort or a finish."""
    remaining = req.prompt[len(req.kv) :]
    if rng.random() < 0.05:
        h.abort(req)
    elif remaining:
        chunk = remaining[: rng.randint(1, 8)]
        if not h.compute(req, chunk):
            h.abort(req)  # out of memory: the scheduler would retract it
        elif rng.random() < 0.7:
            h.unfinished(req)
    elif done[id(req)] == 0:
        h.finish(req)
    elif not h.compute(req, [rng.randint(1, 3)]):
        h.abort(req)
    else:
        done[id(req)] -= 1
        if rng.random() < 0.1:
            h.unfinished(req)


@pytest.mark.parametrize("disable", [False, True])
@pytest.mark.parametrize("page_size", [1, 4])
def test_random_workload(page_size: int, disable: bool) -> None:
    run_random_workload(page_size, disable, steps=1500, seed=page_size * 10 + disable)
