"""KV blocks: fixed runs of `block_size` tokens named by a chained hash, and who hears about them.

The tier store (`scheduler/kv_tier.py`) and the KV events (`scheduler/kv_events.py`) both speak in
blocks, not in radix-tree edges: block b covers token positions [b*B, (b+1)*B) of a sequence, and
its hash chains every token before it, the cache salt and the model's fingerprint:

    h[-1] = H(fingerprint, extra_key)          h[b] = H(h[b-1], tokens[b*B:(b+1)*B])

so equal hashes mean equal KV (same model, same layout, same prefix), across processes and
restarts. Only whole blocks have hashes; a sequence's unaligned tail has none.

Stdlib only (blake2b), like the rest of radix/.
"""

from __future__ import annotations

import hashlib
from array import array
from collections.abc import Sequence
from typing import Protocol

BlockHash = bytes  # 16 bytes of blake2b
HASH_BYTES = 16


def _digest(*parts: bytes) -> BlockHash:
    h = hashlib.blake2b(digest_size=HASH_BYTES)
    for part in parts:
        h.update(len(part).to_bytes(4, "little"))
        h.update(part)
    return h.digest()


def token_bytes(tokens: Sequence[int]) -> bytes:
    """Token ids as little-endian int32 (the store writes them in this form too)."""
    arr = array("i", tokens)
    return arr.tobytes()


class BlockHasher:
    """Chained block hashes for one model fingerprint.

    Args:
        block_size: tokens per block.
        fingerprint: names the model, its dtype and the KV layout; equal fingerprints promise
            equal KV for equal tokens.
    """

    def __init__(self, block_size: int, fingerprint: str) -> None:
        assert block_size >= 1, f"block_size must be >= 1, got {block_size}"
        self.block_size = block_size
        self.fingerprint = fingerprint
        self._seeds: dict[str | None, BlockHash] = {}

    def seed(self, extra_key: str | None) -> BlockHash:
        """The hash before block 0 under cache salt `extra_key`."""
        seed = self._seeds.get(extra_key)
        if seed is None:
            salt = b"\x00" if extra_key is None else b"\x01" + extra_key.encode()
            seed = self._seeds[extra_key] = _digest(self.fingerprint.encode(), salt)
        return seed

    def chain(self, parent: BlockHash, token_ids: bytes) -> BlockHash:
        """The hash of the block after `parent` holding `token_ids` (int32 bytes)."""
        return _digest(parent, token_ids)

    def extend(self, hashes: list[BlockHash], tokens: Sequence[int], extra_key: str | None) -> list[BlockHash]:
        """Append to `hashes` (those of tokens' first len(hashes) blocks) the hashes of every
        further whole block of `tokens`; returns `hashes`."""
        bs = self.block_size
        prev = hashes[-1] if hashes else self.seed(extra_key)
        for b in range(len(hashes), len(tokens) // bs):
            prev = self.chain(prev, token_bytes(tokens[b * bs : (b + 1) * bs]))
            hashes.append(prev)
        return hashes

    def hashes(self, tokens: Sequence[int], extra_key: str | None) -> list[BlockHash]:
        """The hashes of every whole block of `tokens`."""
        return self.extend([], tokens, extra_key)


def blocks_ending_in(start: int, end: int, block_size: int) -> range:
    """Indices of the blocks whose last token lies in positions [start, end): a tree edge over
    those positions is where those blocks are stored, and removed from."""
    return range(start // block_size, end // block_size)


def event_id(block_hash: BlockHash) -> int:
    """A block hash as the 63-bit unsigned int that KV events carry (vLLM's ExternalBlockHash
    may be an int; 63 bits stay positive in every msgpack and JSON reader)."""
    return int.from_bytes(block_hash[:8], "big") >> 1


class BlockEventSink(Protocol):
    """Hears which blocks enter and leave the KV pool (the radix cache calls it)."""

    def stored(self, hashes: Sequence[BlockHash], parent: BlockHash | None, token_ids: Sequence[int]) -> None:
        """Blocks `hashes` (consecutive; `token_ids` is all their tokens) entered the pool;
        `parent` is the hash of the block before the first one, None for block 0."""

    def removed(self, hashes: Sequence[BlockHash]) -> None:
        """Blocks `hashes` left the pool."""

    def cleared(self) -> None:
        """Every block left the pool (a flush)."""
