"""The C++ cascade (kernels/csrc/cascade_attention.cpp): decode rows sharing a KV prefix, the
prefix attended once for all of them and merged with each row's own slots, against plain fp32
torch attention over each row's whole slot list."""

from __future__ import annotations

import pytest
import torch

from runtime.execution.cpu_kernels import load_cpu_kernels


@pytest.fixture(scope="module")
def kernels():
    built = load_cpu_kernels()
    assert built is not None, "the C++ CPU kernels are not built: run `python -m runtime.execution.cpu_kernels build`"
    return built


def _reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, rows: list[torch.Tensor]) -> torch.Tensor:
    """q [B, H, D]; row b attends to the pool's slots rows[b]; fp32."""
    group = q.shape[1] // k.shape[1]
    out = []
    for b, slots in enumerate(rows):
        kb, vb = (t[slots].float().repeat_interleave(group, dim=1).transpose(0, 1) for t in (k, v))  # [H, L, D]
        scores = (q[b].float()[:, None, :] @ kb.transpose(1, 2))[:, 0] * q.shape[2] ** -0.5
        out.append((scores.softmax(-1)[:, None, :] @ vb)[:, 0])
    return torch.stack(out)


# (rows, shared prefix, own tokens of the longest row, KV heads, query heads per KV head, head dim):
# one row; a prefix under one 128-key chunk and over several, not a multiple of the 32-key block;
# more rows than one tile's 48 query rows; every group the kernel has instances for at the ends.
CASES = [(1, 33, 1, 1, 1, 64), (16, 1024, 128, 3, 3, 64), (5, 300, 7, 2, 4, 128), (20, 129, 3, 3, 3, 64),
         (7, 517, 2, 1, 8, 64), (3, 64, 40, 2, 5, 128)]


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 1e-2)])
@pytest.mark.parametrize("batch,shared,own,kv_heads,group,head_dim", CASES)
def test_cascade_matches_whole_rows(kernels, dtype: torch.dtype, tol: float, batch: int, shared: int, own: int,
                                    kv_heads: int, group: int, head_dim: int) -> None:
    gen = torch.Generator().manual_seed(batch * 1000 + shared)
    pool_slots = 1 + shared + batch * own
    k, v = (torch.randn(pool_slots, kv_heads, head_dim, generator=gen).to(dtype) for _ in range(2))
    order = torch.randperm(pool_slots - 1, generator=gen) + 1  # scattered, slot 0 unused (padding)
    prefix = order[:shared]
    owns = [order[shared + b * own :][: max(1, own - b % 3)] for b in range(batch)]  # uneven, at least 1
    q = torch.randn(batch, kv_heads * group, head_dim, generator=gen).to(dtype)
    indptr = torch.tensor([0, *torch.tensor([len(o) for o in owns]).cumsum(0).tolist()])
    out = kernels.cascade_attention(q, k, v, prefix, torch.cat(owns), indptr, head_dim**-0.5)
    expected = _reference(q, k, v, [torch.cat([prefix, o]) for o in owns])
    assert out.dtype == dtype and out.shape == q.shape
    torch.testing.assert_close(out.float(), expected, rtol=tol, atol=tol)
