"""The C++ prefill attention kernel against plain fp32 torch math, alone and behind the torch backend."""

from __future__ import annotations

import pytest
import torch

from kernels.base import ForwardMetadata
from kernels.kv_pool import KVPool
from kernels.torch_backend import TorchAttentionBackend
from runtime.execution.cpu_kernels import load_cpu_kernels

# (new query rows, cached prefix) per request: one row, odd sizes, a prefix of 0, around a tile's
# 48 rows and the 32-key blocks, and a long one.
REQUESTS = [(1, 0), (7, 0), (1, 13), (17, 40), (33, 0), (5, 31), (50, 1), (613, 0), (100, 520)]


@pytest.fixture(scope="module")
def kernels():
    built = load_cpu_kernels()
    assert built is not None, "the C++ CPU kernels are not built: run `python -m runtime.execution.cpu_kernels build`"
    return built


def _reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, prefix: int) -> torch.Tensor:
    """Causal attention in fp32: q [n, H, D] against k, v [prefix + n, KVH, D]."""
    group = q.shape[1] // k.shape[1]
    qf = q.float().transpose(0, 1)  # [H, n, D]
    kf, vf = (t.float().repeat_interleave(group, dim=1).transpose(0, 1) for t in (k, v))
    scores = qf @ kf.transpose(1, 2) * q.shape[2] ** -0.5
    n, total = q.shape[0], k.shape[0]
    allowed = torch.arange(total)[None, :] <= (prefix + torch.arange(n))[:, None]
    probs = torch.softmax(scores.masked_fill(~allowed, float("-inf")), dim=-1)
    return (probs @ vf).transpose(0, 1)


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 1e-2)])
@pytest.mark.parametrize("head_dim,kv_heads,group", [(64, 3, 3), (128, 2, 1), (64, 1, 8), (128, 1, 5), (64, 2, 2)])
def test_kernel_matches_fp32_reference(kernels, dtype: torch.dtype, tol: float, head_dim: int, kv_heads: int,
                                       group: int) -> None:
    gen = torch.Generator().manual_seed(3)
    lens = [n + p for n, p in REQUESTS]
    pool_slots = sum(lens) + 300
    k_pool = torch.randn(pool_slots, kv_heads, head_dim, generator=gen).to(dtype)
    v_pool = torch.randn(pool_slots, kv_heads, head_dim, generator=gen).to(dtype)
    slots = (torch.randperm(pool_slots - 1, generator=gen)[: sum(lens)] + 1).to(torch.int64)  # scattered
    kv_indptr = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int64)
    q_indptr = torch.tensor([0, *torch.tensor([n for n, _ in REQUESTS]).cumsum(0).tolist()], dtype=torch.int64)
    q = torch.randn(int(q_indptr[-1]), kv_heads * group, head_dim, generator=gen).to(dtype)
    out = torch.full_like(q, 7.0)
    kernels.prefill_attention(q, k_pool, v_pool, slots, q_indptr, kv_indptr, head_dim**-0.5, out)
    for b, (n, prefix) in enumerate(REQUESTS):
        s = slots[kv_indptr[b] : kv_indptr[b + 1]]
        want = _reference(q[q_indptr[b] : q_indptr[b + 1]], k_pool[s], v_pool[s], prefix)
        got = out[q_indptr[b] : q_indptr[b + 1]].float()
        err = ((got - want).norm() / want.norm()).item()
        assert err <= tol, (b, n, prefix, err)


def test_requests_without_kv_are_skipped_and_bad_shapes_refused(kernels) -> None:
    gen = torch.Generator().manual_seed(4)
    q, pool = torch.randn(6, 6, 64, generator=gen), torch.randn(20, 2, 64, generator=gen)
    slots = torch.arange(20, dtype=torch.int64)
    q_indptr, kv_indptr = torch.tensor([0, 2, 6]), torch.tensor([0, 0, 10])  # request 0: no KV, skipped
    out = torch.full_like(q, 7.0)
    kernels.prefill_attention(q, pool, pool, slots, q_indptr, kv_indptr, 0.125, out)
    assert (out[:2] == 7.0).all()
    torch.testing.assert_close(out[2:], _reference(q[2:], pool[:10], pool[:10], 6), rtol=1e-5, atol=1e-5)
    with pytest.raises(RuntimeError, match="has 4 query rows and 3 KV slots"):
        kernels.prefill_attention(q, pool, pool, slots, q_indptr, torch.tensor([0, 0, 3]), 0.125, out)
    with pytest.raises(RuntimeError, match="head_dim 64 or 128"):
        small = torch.randn(6, 6, 16)
        kernels.prefill_attention(small, pool[..., :16].contiguous(), pool[..., :16].contiguous(), slots, q_indptr,
                                  kv_indptr, 0.25, torch.empty_like(small))


def _metadata(seq_lens: list[int], extend_lens: list[int], slots: torch.Tensor) -> ForwardMetadata:
    """Page size 1: the pages are the slots, request after request."""
    cum = lambda xs: torch.tensor([sum(xs[:i]) for i in range(len(xs) + 1)], dtype=torch.int32)  # noqa: E731
    starts = cum(seq_lens).tolist()
    out_loc = torch.cat([slots[s + n - e : s + n] for s, n, e in zip(starts, seq_lens, extend_lens)])
    positions = torch.tensor([p for n, e in zip(seq_lens, extend_lens) for p in range(n - e, n)])
    return ForwardMetadata(kv_indices=slots.to(torch.int32), positions=positions, out_cache_loc=out_loc, page_size=1,
                           seq_lens=seq_lens, extend_lens=extend_lens, qo_indptr_host=cum(extend_lens),
                           kv_indptr_host=cum(seq_lens),
                           kv_last_page_len_host=torch.ones(len(seq_lens), dtype=torch.int32))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("extend_lens", [[30, 64, 9], [30, 1, 3, 64]], ids=["prefill", "mixed"])
def test_backend_kernel_path_matches_torch_path(kernels, dtype: torch.dtype, extend_lens: list[int]) -> None:
    """The backend's kernel path against its torch path (the oracle), short extends of a mixed
    batch still attending as decode rows."""
    gen = torch.Generator().manual_seed(5)
    heads, kv_heads, dim = 9, 3, 64
    seq_lens = [n + p for n, p in zip(extend_lens, [0, 37, 100, 5])]
    pool_slots = sum(seq_lens) + 50
    slots = (torch.randperm(pool_slots - 1, generator=gen)[: sum(seq_lens)] + 1).to(torch.int64)
    meta = _metadata(seq_lens, extend_lens, slots)
    q = torch.randn(sum(extend_lens), heads, dim, generator=gen).to(dtype)
    new_k, new_v = (torch.randn(sum(extend_lens), kv_heads, dim, generator=gen).to(dtype) for _ in range(2))
    outs = []
    for use in (None, kernels):
        pool = KVPool(1, pool_slots, kv_heads, dim, dtype, torch.device("cpu"), 1)
        prefix_gen = torch.Generator().manual_seed(6)
        pool.k[0].copy_(torch.randn(pool.k[0].shape, generator=prefix_gen))
        pool.v[0].copy_(torch.randn(pool.v[0].shape, generator=prefix_gen))
        backend = TorchAttentionBackend(pool, heads, kv_heads, dim, use)
        backend.plan(meta)
        assert (backend.extend_kernel is not None) == (use is not None)
        outs.append(backend.forward(0, q, new_k, new_v).float())
    err = ((outs[1] - outs[0]).norm() / outs[0].norm()).item()
    assert err <= (1e-5 if dtype == torch.float32 else 1e-2), err
