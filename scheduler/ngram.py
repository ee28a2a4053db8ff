"""N-gram drafts for speculative decoding (`--speculative-algorithm ngram`): the tokens that
followed the latest earlier occurrence of the sequence's last n tokens, looked up in the
request's own prompt and output (no draft model; vLLM's prompt lookup, SGLang's ngram).

`NgramIndex` keeps, for each n in [min_n, max_n], the end of the latest occurrence of every
n-gram, updated incrementally as the sequence grows (a request's tokens only ever append, also
across retraction), so a lookup costs O(max_n) and an update O(max_n) per new token.

Pure Python: no torch.
"""

from __future__ import annotations


class NgramIndex:
    def __init__(self, min_n: int, max_n: int) -> None:
        assert 1 <= min_n <= max_n
        self.min_n, self.max_n = min_n, max_n
        self.latest: dict[tuple[int, ...], int] = {}  # n-gram -> end (exclusive) of its latest occurrence
        self.indexed = 0  # n-grams ending at or before this position are in `latest`

    def propose(self, tokens: list[int], k: int) -> list[int]:
        """Up to `k` drafts to follow `tokens`: after the longest suffix (n from max_n down to
        min_n) that also occurs earlier, what followed its latest earlier occurrence; [] when
        none does."""
        end = len(tokens)
        self._index(tokens, end - 1)  # every occurrence but the suffix itself
        for n in range(min(self.max_n, end - 1), self.min_n - 1, -1):
            found = self.latest.get(tuple(tokens[end - n:]))
            if found is not None:
                return tokens[found:found + k]
        return []

    def _index(self, tokens: list[int], upto: int) -> None:
        """Add the n-grams ending at positions (self.indexed, upto]."""
        for stop in range(self.indexed + 1, upto + 1):
            for n in range(self.min_n, min(self.max_n, stop) + 1):
                self.latest[tuple(tokens[stop - n:stop])] = stop
        self.indexed = max(self.indexed, upto)
