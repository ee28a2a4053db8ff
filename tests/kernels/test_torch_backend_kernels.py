"""The torch attention backend's C++ kernel path (kernels/torch_backend.py with the built kernels)
against its torch path, the oracle: the same batch, prefill and mixed, through both."""

from __future__ import annotations

from types import ModuleType

import pytest
import torch

from kernels.base import ForwardMetadata
from kernels.kv_pool import KVPool
from kernels.torch_backend import TorchAttentionBackend
from runtime.execution.cpu_kernels import load_cpu_kernels


@pytest.fixture(scope="module")
def kernels() -> ModuleType:
    built = load_cpu_kernels()
    assert built is not None, "the C++ CPU kernels are not built: run `python -m runtime.execution.cpu_kernels build`"
    return built


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
def test_backend_kernel_path_matches_torch_path(kernels: ModuleType, dtype: torch.dtype,
                                                extend_lens: list[int]) -> None:
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
