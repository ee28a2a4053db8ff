"""Pure-Python KV bookkeeping: slot allocator, radix tree and the prefix cache (stdlib only)."""

from radix.allocator import KVAllocator
from radix.prefix_cache import (
    BasePrefixCache,
    CacheUpdate,
    NoPrefixCache,
    RadixPrefixCache,
    make_prefix_cache,
)
from radix.tree import MatchResult, RadixTree, TreeNode

__all__ = [
    "BasePrefixCache",
    "CacheUpdate",
    "KVAllocator",
    "MatchResult",
    "NoPrefixCache",
    "RadixPrefixCache",
    "RadixTree",
    "TreeNode",
    "make_prefix_cache",
]
