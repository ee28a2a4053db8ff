"""N-gram drafts: the latest earlier occurrence of the longest matching suffix."""

from __future__ import annotations

import random

from scheduler.ngram import NgramIndex


def naive(tokens: list[int], k: int, min_n: int, max_n: int) -> list[int]:
    end = len(tokens)
    for n in range(min(max_n, end - 1), min_n - 1, -1):
        suffix = tokens[end - n:]
        for start in range(end - n - 1, -1, -1):  # latest earlier occurrence first
            if tokens[start:start + n] == suffix:
                return tokens[start + n:start + n + k]
    return []


def test_code_editing_repeats_the_prompt() -> None:
    prompt = [5, 6, 7, 8, 9, 10, 11, 12]
    index = NgramIndex(1, 3)
    assert index.propose(prompt + [6, 7], 4) == [8, 9, 10, 11]  # "6 7" occurred: what followed it
    assert index.propose(prompt + [6, 7, 8], 4) == [9, 10, 11, 12]
    assert index.propose([1, 2, 3], 4) == []


def test_prefers_the_longest_then_the_latest_match() -> None:
    tokens = [1, 2, 9, 3, 2, 8, 1, 2]
    assert NgramIndex(1, 3).propose(tokens, 2) == [9, 3]  # "1 2" beats the later "2"
    assert NgramIndex(1, 1).propose(tokens, 2) == [8, 1]  # only "2": its latest earlier place


def test_incremental_index_matches_a_naive_search() -> None:
    rng = random.Random(0)
    for _ in range(50):
        index = NgramIndex(1, 4)
        tokens = [rng.randrange(6) for _ in range(3)]
        for _ in range(60):
            assert index.propose(tokens, 3) == naive(tokens, 3, 1, 4)
            tokens.append(rng.randrange(6))
