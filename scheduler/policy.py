"""Waiting-queue ordering and prefill admission (the PrefillAdder).

A request is admitted when the KV pool (free + evictable) minus what running requests are
expected to still take (`retract.reserved_kv`) covers its uncomputed tokens and its clipped
output (`retract.admission_kv`). A pool too small for everyone at once admits fewer at a time;
when the optimistic reservations fall short during decode, the scheduler retracts.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from radix.prefix_cache import BasePrefixCache
from radix.tree import RadixTree, TreeNode
from scheduler.request import Req
from scheduler.retract import admission_kv

LPM_FCFS_FALLBACK = 128  # longest-prefix-match sorting costs a tree walk per waiting request
# In-batch prefix dedup (SGLang's thresholds): a request with at most CHECK cached tokens that
# shares at least DEFER tokens with an earlier waiting request sits out this round, so the
# earlier one fills the cache and it then hits it.
IN_BATCH_CHECK = 32
IN_BATCH_DEFER = 32


def order_waiting(queue: list[Req], policy: str, cache: BasePrefixCache) -> list[Req]:
    """The waiting requests to consider this round, in the order the policy admits them.

    fcfs keeps arrival order. lpm sorts by longest cached prefix (FCFS beyond 128 waiting).
    dfs-weight walks the radix tree from the root, heavier subtrees (more waiting requests)
    first, so requests sharing a prefix run together. Both cache-aware policies defer
    requests whose prefix another waiting request is about to cache.
    """
    if policy == "fcfs" or (policy == "lpm" and len(queue) > LPM_FCFS_FALLBACK):
        return list(queue)
    if policy not in ("lpm", "dfs-weight"):
        raise ValueError(f"unknown schedule policy {policy!r}")
    matches = {id(r): cache.match(r.fill_ids[: r.max_prefix_len()], r.extra_key) for r in queue}
    deferred = _in_batch_duplicates(queue, {k: len(m.indices) for k, m in matches.items()})
    live = [r for r in queue if id(r) not in deferred]
    if policy == "lpm":
        return sorted(live, key=lambda r: -len(matches[id(r)].indices))
    return _dfs_weight(live, {id(r): matches[id(r)].node for r in live})


def _in_batch_duplicates(queue: list[Req], cached: dict[int, int]) -> set[int]:
    """Requests to defer one round because an earlier waiting request shares their prefix."""
    seen = RadixTree()
    deferred: set[int] = set()
    for req in queue:
        if cached[id(req)] > IN_BATCH_CHECK:
            continue
        tokens = req.fill_ids
        if len(seen.match_prefix(tokens, req.extra_key).indices) >= IN_BATCH_DEFER:
            deferred.add(id(req))
        else:
            seen.insert(tokens, [0] * len(tokens), req.extra_key)  # values unused
    return deferred


def _dfs_weight(queue: list[Req], nodes: dict[int, TreeNode]) -> list[Req]:
    """SGLang's dfs-weight order: each node's weight is the number of waiting requests whose
    match ends in its subtree; a post-order walk visits heavier children first and emits a
    node's own requests after its subtree's (deeper cache hits first)."""
    at_node: dict[int, list[Req]] = {}
    weight: dict[int, int] = {}
    children: dict[int, list[TreeNode]] = {}
    root: TreeNode | None = None
    for req in queue:
        node: TreeNode | None = nodes[id(req)]
        at_node.setdefault(id(node), []).append(req)
        while node is not None:
            weight[id(node)] = weight.get(id(node), 0) + 1
            parent = node.parent
            if parent is not None and weight[id(node)] == 1:
                children.setdefault(id(parent), []).append(node)
            root = node if parent is None else root
            node = parent
    order: list[Req] = []
    stack: list[tuple[TreeNode, bool]] = [(root, False)] if root is not None else []
    while stack:
        node, expanded = stack.pop()
        if expanded:
            order.extend(at_node.get(id(node), []))
            continue
        stack.append((node, True))
        kids = sorted(children.get(id(node), []), key=lambda n: weight[id(n)])
        stack.extend((kid, False) for kid in kids)  # the heaviest child is popped first
    return order


@dataclass
class PrefillAdder:
    """Packs waiting requests into one prefill batch under the KV, token and chunk budgets."""

    cache: BasePrefixCache
    page_size: int
    reserved: int  # KV that running requests will still need
    rem_input: int  # prefill tokens left in this batch
    rem_chunk: int | None  # chunk budget; None: chunking disabled
    rem_reqs: int  # request slots left (max_running_requests and free rows)
    admitted: list[tuple[Req, int]] = field(default_factory=list)  # (request, tokens to compute)
    new_chunked: Req | None = None

    def rem_kv(self) -> int:
        return self.cache.available() + self.cache.evictable_size - self.reserved

    def budget_left(self) -> bool:
        return self.rem_input > 0 and (self.rem_chunk is None or self.rem_chunk > 0) and self.rem_reqs > 0

    def kv_fits(self, req: Req, cached: int) -> bool:
        """Does the KV `req` asks for, beyond its `cached` prefix, fit what is left?"""
        return admission_kv(req, self.page_size) - cached <= self.rem_kv()

    def try_add(self, req: Req, prefix: list[int], extend: int) -> bool:
        """Admit `req` (its locked prefix match already in `prefix`) computing up to `extend`
        tokens now; returns False when it does not fit (the caller stops admitting)."""
        if not self.kv_fits(req, len(prefix)):
            return False
        if self.admitted and extend > self.rem_input:
            return False
        if self.rem_chunk is not None and extend > self.rem_chunk:
            extend = self.rem_chunk // self.page_size * self.page_size
            if extend <= 0:
                return False
            self.new_chunked = req
        self.admitted.append((req, extend))
        self.reserved += admission_kv(req, self.page_size) - len(prefix)
        self.rem_input -= extend
        if self.rem_chunk is not None:
            self.rem_chunk -= extend
        self.rem_reqs -= 1
        return True
