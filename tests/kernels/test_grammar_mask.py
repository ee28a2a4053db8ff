"""Token bitmasks on logits: xgrammar's bit order, row subsets, equivalence with xgrammar."""

from __future__ import annotations

import sys

import pytest
import torch

from kernels import grammar_mask
from kernels.grammar_mask import apply_token_bitmask, apply_token_bitmask_torch, bitmask_words

NEG_INF = float("-inf")
APPLIERS = {"dispatch": apply_token_bitmask, "torch": apply_token_bitmask_torch}


def mask_allowing(allowed: list[set[int]], vocab: int) -> torch.Tensor:
    """A bitmask built bit by bit: bit j of word w allows token 32 w + j."""
    words = [[0] * bitmask_words(vocab) for _ in allowed]
    for r, ids in enumerate(allowed):
        for t in ids:
            words[r][t // 32] |= 1 << (t % 32)
    # int32 two's complement: bit 31 is the sign bit.
    signed = [[w - (1 << 32) if w >= 1 << 31 else w for w in row] for row in words]
    return torch.tensor(signed, dtype=torch.int32)


def random_bitmask(rows: int, vocab: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(-(2**31), 2**31, (rows, bitmask_words(vocab)), generator=g,
                         dtype=torch.int64).to(torch.int32)


def expected(logits: torch.Tensor, bitmask: torch.Tensor, rows: list[int]) -> torch.Tensor:
    """The naive reference: one bit at a time."""
    out = logits.clone()
    vocab = logits.shape[1]
    for r in rows:
        for t in range(vocab):
            w = t // 32
            if w >= bitmask.shape[1] or not (int(bitmask[r, w]) >> (t % 32)) & 1:
                out[r, t] = NEG_INF
    return out


@pytest.mark.parametrize("name", list(APPLIERS))
def test_bit_order_lsb_first(name: str) -> None:
    vocab = 100  # not a multiple of 32: the last word is partial
    allowed = [{0, 31, 32, 63, 64, 99}, {5}, set(range(vocab))]
    logits = torch.zeros(3, vocab)
    APPLIERS[name](logits, mask_allowing(allowed, vocab), [0, 1, 2])
    for r, ids in enumerate(allowed):
        assert set(torch.isfinite(logits[r]).nonzero().flatten().tolist()) == ids


@pytest.mark.parametrize("name", list(APPLIERS))
@pytest.mark.parametrize("rows", [[0, 1, 2, 3], [1, 3], [2], []])
def test_matches_naive_reference_on_row_subsets(name: str, rows: list[int]) -> None:
    vocab = 130
    logits = torch.randn(4, vocab, generator=torch.Generator().manual_seed(1))
    bitmask = random_bitmask(4, vocab)
    want = expected(logits, bitmask, rows)
    APPLIERS[name](logits, bitmask, rows)
    assert torch.equal(logits, want)


def shaped_bitmask(kinds: str, vocab: int, seed: int = 0) -> torch.Tensor:
    """One row per letter: s(parse: a few allowed tokens), d(ense: all but a few), z(ero: none),
    a(ll), r(andom)."""
    g = torch.Generator().manual_seed(seed)
    rows = []
    for kind in kinds:
        if kind in "sd":
            picks = set(torch.randint(0, vocab, (7,), generator=g).tolist())
            rows.append(picks if kind == "s" else set(range(vocab)) - picks)
        else:
            rows.append({"z": set(), "a": set(range(vocab))}.get(kind, set()))
    mask = mask_allowing(rows, vocab)
    for i, kind in enumerate(kinds):
        if kind == "r":
            mask[i] = random_bitmask(1, vocab, seed=seed + i)[0]
    return mask


@pytest.mark.parametrize("kinds,rows", [
    ("sdzar", [0, 1, 2, 3, 4]), ("sdzar", [4, 0, 2]), ("ssss", [1, 2]), ("dddd", [0, 3]),
])
def test_sparse_and_dense_rows_match_naive_reference(kinds: str, rows: list[int]) -> None:
    """Exact-width logits on CPU take the sparse/dense split; both halves must agree bit-exactly
    with the reference (V = 2048: 64 words, so rows with < 16 live words are sparse)."""
    vocab = 2048
    logits = torch.randn(len(kinds), vocab, generator=torch.Generator().manual_seed(7))
    bitmask = shaped_bitmask(kinds, vocab)
    assert grammar_mask._split_sparse(bitmask, list(range(len(kinds))))[0] == [
        i for i, k in enumerate(kinds) if k in "sz"]
    want = expected(logits, bitmask, rows)
    apply_token_bitmask(logits, bitmask, rows)
    assert torch.equal(logits, want)


def test_full_vocab_dispatch_matches_torch_version() -> None:
    vocab = 49152
    bitmask = shaped_bitmask("sdzarsd", vocab, seed=8)
    logits = torch.randn(7, vocab, generator=torch.Generator().manual_seed(9))
    ours, ref = logits.clone(), logits.clone()
    apply_token_bitmask(ours, bitmask, [0, 1, 2, 3, 4, 6])
    apply_token_bitmask_torch(ref, bitmask, [0, 1, 2, 3, 4, 6])
    assert torch.equal(ours, ref)


def test_rows_as_tensor_and_untouched_rows() -> None:
    logits = torch.randn(5, 64)
    before = logits.clone()
    bitmask = mask_allowing([{1}] * 5, 64)
    apply_token_bitmask(logits, bitmask, torch.tensor([3]))
    assert torch.equal(logits[[0, 1, 2, 4]], before[[0, 1, 2, 4]])
    assert torch.isfinite(logits[3]).nonzero().flatten().tolist() == [1]


@pytest.mark.parametrize("name", list(APPLIERS))
def test_all_allowed_rows_are_bitwise_unchanged(name: str) -> None:
    logits = torch.randn(3, 49152)
    before = logits.clone()
    bitmask = torch.full((3, bitmask_words(49152)), -1, dtype=torch.int32)
    APPLIERS[name](logits, bitmask, [0, 1, 2])
    assert torch.equal(logits, before)


def test_logits_wider_than_bitmask_block_the_rest() -> None:
    logits = torch.zeros(2, 80)
    bitmask = torch.full((2, 2), -1, dtype=torch.int32)  # covers 64 tokens
    apply_token_bitmask(logits, bitmask, [1])
    assert torch.isfinite(logits[1, :64]).all() and torch.isinf(logits[1, 64:]).all()
    assert torch.isfinite(logits[0]).all()


def test_bitmask_wider_than_logits_is_ignored_past_vocab() -> None:
    logits = torch.zeros(1, 40)
    bitmask = mask_allowing([{3, 39}], 64)  # two words; tokens 40..63 do not exist
    apply_token_bitmask(logits, bitmask, [0])
    assert torch.isfinite(logits[0]).nonzero().flatten().tolist() == [3, 39]


def test_bf16_logits() -> None:
    logits = torch.randn(2, 96).to(torch.bfloat16)
    bitmask = random_bitmask(2, 96, seed=3)
    want = expected(logits.float(), bitmask, [0, 1])
    apply_token_bitmask(logits, bitmask, [0, 1])
    assert torch.equal(logits.float(), want)


def test_falls_back_to_torch_without_xgrammar(monkeypatch: pytest.MonkeyPatch) -> None:
    """With xgrammar's kernel unimportable the dispatch uses the torch version."""
    monkeypatch.setitem(sys.modules, "xgrammar.kernels.apply_token_bitmask_inplace_cpu", None)
    monkeypatch.setattr(grammar_mask, "_xgr_kernel", False)  # look it up again
    assert grammar_mask._xgrammar_cpu_kernel() is None
    logits = torch.randn(2, 64)
    bitmask = random_bitmask(2, 64, seed=4)
    want = expected(logits, bitmask, [1])
    apply_token_bitmask(logits, bitmask, [1])
    assert torch.equal(logits, want)


@pytest.mark.parametrize("rows", [None, [0, 2, 5]])
def test_equivalent_to_xgrammar_apply(rows: list[int] | None) -> None:
    import xgrammar as xgr  # a hard dependency: missing is a failure, not a skip
    vocab, batch = 49152, 8
    logits = torch.randn(batch, vocab, generator=torch.Generator().manual_seed(2))
    bitmask = random_bitmask(batch, vocab, seed=5)
    ours, theirs = logits.clone(), logits.clone()
    xgr.apply_token_bitmask_inplace(theirs, bitmask, indices=rows)
    apply_token_bitmask_torch(ours, bitmask, rows if rows is not None else list(range(batch)))
    assert torch.equal(ours, theirs)
    ours = logits.clone()
    bitmask = shaped_bitmask("sdzasdza", vocab, seed=10)
    theirs = logits.clone()
    xgr.apply_token_bitmask_inplace(theirs, bitmask, indices=rows)
    apply_token_bitmask(ours, bitmask, rows if rows is not None else list(range(batch)))
    assert torch.equal(ours, theirs)


@pytest.mark.gpu
def test_torch_version_on_cuda_matches_cpu() -> None:
    vocab, batch = 49152, 4
    logits = torch.randn(batch, vocab)
    bitmask = random_bitmask(batch, vocab, seed=6)
    cpu = logits.clone()
    apply_token_bitmask(cpu, bitmask, [0, 3])
    gpu = logits.cuda()
    apply_token_bitmask(gpu, bitmask.cuda(), [0, 3])
    assert torch.equal(gpu.cpu(), cpu)



def test_every_row_in_one_pass_without_a_row_index() -> None:
    """The GPU way (apply_row_bitmasks hands it every row, the unconstrained ones all ones): no row
    index built from a host list (a blocking copy on a GPU), and no per-row fills."""
    from tests.runtime.execution.test_sync_free_step import SyncRecorder

    vocab, batch = 100, 3
    bitmask = torch.full((batch, bitmask_words(vocab)), -1, dtype=torch.int32)
    bitmask[1] = 0
    bitmask[1, 0] = 0b101  # row 1 allows tokens 0 and 2 only
    logits = torch.randn(batch, vocab)
    expected = logits.clone()
    expected[1, 1] = float("-inf")
    expected[1, 3:] = float("-inf")
    apply_token_bitmask_torch(torch.randn(batch, vocab), bitmask, [0])  # the bit table, cached per device
    with SyncRecorder() as recorder:
        apply_token_bitmask_torch(logits, bitmask, list(range(batch)))
    assert recorder.calls == [], recorder.calls
    assert torch.equal(logits, expected)
