"""Paged attention backends against a dense per-request reference (repeats KV heads: oracle only)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from kernels.base import ForwardMetadata
from kernels.kv_pool import KVPool
from kernels.torch_backend import TorchAttentionBackend

HEADS, KV_HEADS, DIM, LAYERS = 6, 2, 16, 2


def _metadata(page_lists: list[list[int]], seq_lens: list[int], extend_lens: list[int], ps: int) -> ForwardMetadata:
    """Metadata for requests whose KV lives in the given pages (oracle construction, no runner)."""
    slots = [[p * ps + o for p in pages for o in range(ps)][:n] for pages, n in zip(page_lists, seq_lens)]
    out_loc = [s for sl, n, e in zip(slots, seq_lens, extend_lens) for s in sl[n - e : n]]
    positions = [p for n, e in zip(seq_lens, extend_lens) for p in range(n - e, n)]
    cum = lambda xs: torch.tensor([sum(xs[:i]) for i in range(len(xs) + 1)], dtype=torch.int32)  # noqa: E731
    return ForwardMetadata(
        kv_indices=torch.tensor([p for pages in page_lists for p in pages], dtype=torch.int32),
        positions=torch.tensor(positions),
        out_cache_loc=torch.tensor(out_loc),
        page_size=ps,
        seq_lens=seq_lens,
        extend_lens=extend_lens,
        qo_indptr_host=cum(extend_lens),
        kv_indptr_host=cum([len(p) for p in page_lists]),
        kv_last_page_len_host=torch.tensor(
            [n - (len(p) - 1) * ps for p, n in zip(page_lists, seq_lens)], dtype=torch.int32),
    )


def _reference(q, k_seq, v_seq, prefix_len):  # q [e, H, D], k_seq [n, KVH, D]
    rep = HEADS // KV_HEADS
    k = k_seq.repeat_interleave(rep, dim=1).transpose(0, 1)
    v = v_seq.repeat_interleave(rep, dim=1).transpose(0, 1)
    n, e = k_seq.shape[0], q.shape[0]
    mask = torch.arange(n)[None, :] <= (prefix_len + torch.arange(e))[:, None]
    o = F.scaled_dot_product_attention(q.transpose(0, 1), k, v, attn_mask=mask)
    return o.transpose(0, 1).reshape(e, -1)


def _kernels(use: bool):
    """Our built C++ kernels (a hard requirement: make setup builds them), or None."""
    if not use:
        return None
    from runtime.execution.cpu_kernels import load_cpu_kernels

    kernels = load_cpu_kernels()
    assert kernels is not None, "the C++ CPU kernels are not built: run `python -m runtime.execution.cpu_kernels build`"
    return kernels


@pytest.mark.parametrize("use_kernels", [False, True], ids=["torch", "cpp"])
@pytest.mark.parametrize("page_size", [1, 4])
@pytest.mark.parametrize("extend_lens", [[1, 1, 1], [5, 1, 12], [7, 3, 2], [1, 6, 1], [3, 1, 1]])  # mixed: the last two
def test_torch_backend_matches_dense(page_size: int, extend_lens: list[int], use_kernels: bool) -> None:
    gen = torch.Generator().manual_seed(0)
    seq_lens = [9, 14, 12]
    num_pages = 64
    pool = KVPool(LAYERS, num_pages * page_size, KV_HEADS, DIM, torch.float32, torch.device("cpu"), page_size)
    perm = (torch.randperm(num_pages - 1, generator=gen) + 1).tolist()  # page 0 is padding
    page_lists = []
    for n in seq_lens:
        k = -(-n // page_size)
        page_lists.append(perm[:k])
        perm = perm[k:]
    meta = _metadata(page_lists, seq_lens, extend_lens, page_size)
    # The cached prefix K/V is already in the pool; the new tokens' K/V come with the call.
    full_k = [torch.randn(n, KV_HEADS, DIM, generator=gen) for n in seq_lens]
    full_v = [torch.randn(n, KV_HEADS, DIM, generator=gen) for n in seq_lens]
    for pages, n, e, k, v in zip(page_lists, seq_lens, extend_lens, full_k, full_v):
        slots = torch.tensor([p * page_size + o for p in pages for o in range(page_size)][: n - e], dtype=torch.int64)
        for layer in range(LAYERS):
            pool.write(layer, slots, k[: n - e], v[: n - e])
    q = torch.randn(sum(extend_lens), HEADS, DIM, generator=gen)
    new_k = torch.cat([k[n - e :] for k, n, e in zip(full_k, seq_lens, extend_lens)])
    new_v = torch.cat([v[n - e :] for v, n, e in zip(full_v, seq_lens, extend_lens)])

    backend = TorchAttentionBackend(pool, HEADS, KV_HEADS, DIM, _kernels(use_kernels))
    backend.plan(meta)
    for layer in range(LAYERS):
        out = backend.forward(layer, q, new_k, new_v)
        start = 0
        for n, e, k, v in zip(seq_lens, extend_lens, full_k, full_v):
            expected = _reference(q[start : start + e], k, v, n - e)
            torch.testing.assert_close(out[start : start + e], expected, rtol=1e-5, atol=1e-5)
            start += e


@pytest.mark.gpu
@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("extend_lens", [[1, 1, 1], [5, 1, 12]])
def test_flashinfer_matches_torch_backend(page_size: int, extend_lens: list[int]) -> None:
    from kernels.flashinfer_backend import FlashInferAttentionBackend

    dev = torch.device("cuda")
    gen = torch.Generator().manual_seed(0)
    seq_lens = [40, 17, 64]
    num_pages = 256 // page_size + 8
    pools = [KVPool(1, num_pages * page_size, KV_HEADS, 64, torch.bfloat16, dev, page_size) for _ in range(2)]
    pages, nxt = [], 1
    for n in seq_lens:
        k = -(-n // page_size)
        pages.append(list(range(nxt, nxt + k)))
        nxt += k
    meta = _metadata(pages, seq_lens, extend_lens, page_size)
    meta_dev = ForwardMetadata(**{**meta.__dict__, **{
        f: getattr(meta, f).to(dev)
        for f in ("kv_indices", "positions", "out_cache_loc")
    }})
    prefix_k = torch.randn(num_pages * page_size, KV_HEADS, 64, generator=gen).to(dev, torch.bfloat16)
    for pool in pools:
        pool.k[0].copy_(prefix_k)
        pool.v[0].copy_(prefix_k.flip(0))
    t = sum(extend_lens)
    q = torch.randn(t, HEADS, 64, generator=gen).to(dev, torch.bfloat16)
    k = torch.randn(t, KV_HEADS, 64, generator=gen).to(dev, torch.bfloat16)
    v = torch.randn(t, KV_HEADS, 64, generator=gen).to(dev, torch.bfloat16)
    outs = []
    backends = (TorchAttentionBackend(pools[0], HEADS, KV_HEADS, 64),
                FlashInferAttentionBackend(pools[1], HEADS, KV_HEADS, 64, torch.bfloat16))
    for backend in backends:
        backend.plan(meta_dev)
        outs.append(backend.forward(0, q, k, v).float())
    torch.testing.assert_close(outs[1], outs[0], rtol=2e-2, atol=2e-2)


def test_common_prefix_len_and_merge() -> None:
    from kernels import cascade

    padded = torch.tensor([[5, 6, 7, 8], [5, 6, 9, 9], [5, 6, 7, 1]])
    assert cascade.common_prefix_len(padded, 4) == 2
    assert cascade.common_prefix_len(padded, 1) == 1 and cascade.common_prefix_len(padded, 0) == 0
    gen = torch.Generator().manual_seed(4)
    q, k, v = (torch.randn(1, 2, 3, 8, generator=gen) for _ in range(3))
    k2, v2 = torch.randn(1, 2, 5, 8, generator=gen), torch.randn(1, 2, 5, 8, generator=gen)
    whole = F.scaled_dot_product_attention(q, torch.cat([k, k2], 2), torch.cat([v, v2], 2))
    a, la = cascade.attend(q, k, v, None, 8**-0.5)
    b, lb = cascade.attend(q, k2, v2, None, 8**-0.5)
    torch.testing.assert_close(cascade.merge(a, la, b, lb), whole, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 3e-2)])
@pytest.mark.parametrize("page_size", [1, 4])
@pytest.mark.parametrize("prefill_too", [False, True])
@pytest.mark.parametrize("use_kernels", [False, True], ids=["torch", "cpp"])
def test_shared_prefix_is_attended_once(dtype: torch.dtype, tol: float, page_size: int, prefill_too: bool,
                                        use_kernels: bool) -> None:
    """Sixteen decode rows (and, mixed, one prefill) share a 520-token KV prefix: the backend asked
    for the cascade attends to it once and still matches the dense per-request reference."""
    from kernels.decode_attention import CASCADE_MIN

    gen = torch.Generator().manual_seed(1)
    shared_len, own_lens = 520, [1, 3, 20, 7, 1, 12, 5, 9, 2, 4, 8, 1, 30, 6, 2, 11]
    extend_lens = [1] * len(own_lens)
    if prefill_too:
        own_lens, extend_lens = own_lens + [6], extend_lens + [6]
    min_batch, min_shared = CASCADE_MIN["kernel" if use_kernels else "torch"]
    assert len(own_lens) - prefill_too >= min_batch and shared_len >= min_shared
    shared_pages = list(range(1, 1 + shared_len // page_size))
    nxt = shared_pages[-1] + 1
    page_lists, seq_lens = [], []
    for own in own_lens:
        k = -(-own // page_size)
        page_lists.append(shared_pages + list(range(nxt, nxt + k)))
        nxt += k
        seq_lens.append(shared_len + own)
    pool = KVPool(LAYERS, (nxt + 1) * page_size, KV_HEADS, DIM, dtype, torch.device("cpu"), page_size)
    meta = _metadata(page_lists, seq_lens, extend_lens, page_size)
    shared_k, shared_v = (torch.randn(shared_len, KV_HEADS, DIM, generator=gen) for _ in range(2))
    full_k = [torch.cat([shared_k, torch.randn(own, KV_HEADS, DIM, generator=gen)]) for own in own_lens]
    full_v = [torch.cat([shared_v, torch.randn(own, KV_HEADS, DIM, generator=gen)]) for own in own_lens]
    for pages, n, e, k, v in zip(page_lists, seq_lens, extend_lens, full_k, full_v):
        slots = torch.tensor([p * page_size + o for p in pages for o in range(page_size)][: n - e], dtype=torch.int64)
        for layer in range(LAYERS):
            pool.write(layer, slots, k[: n - e], v[: n - e])
    q = torch.randn(sum(extend_lens), HEADS, DIM, generator=gen).to(dtype)
    new_k = torch.cat([k[n - e :] for k, n, e in zip(full_k, seq_lens, extend_lens)]).to(dtype)
    new_v = torch.cat([v[n - e :] for v, n, e in zip(full_v, seq_lens, extend_lens)]).to(dtype)
    per_row = TorchAttentionBackend(pool, HEADS, KV_HEADS, DIM, _kernels(use_kernels))
    per_row.plan(meta)
    assert per_row.decoder.shared_index is None, "the cascade is off unless asked for"
    backend = TorchAttentionBackend(pool, HEADS, KV_HEADS, DIM, _kernels(use_kernels), cascade=True)
    backend.plan(meta)
    assert backend.decoder.shared_index is not None and len(backend.decoder.shared_index) == shared_len
    for layer in range(LAYERS):
        out = backend.forward(layer, q, new_k, new_v).float()
        start = 0
        for n, e, k, v in zip(seq_lens, extend_lens, full_k, full_v):
            kd, vd = k.to(dtype).float(), v.to(dtype).float()
            expected = _reference(q[start : start + e].float(), kd, vd, n - e)
            err = ((out[start : start + e] - expected).norm() / expected.norm()).item()
            assert err <= tol, (n, e, err)
            start += e


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 1e-2)])
# Each (head size, query rows per KV head) is an instance of its own: both head sizes, several counts.
@pytest.mark.parametrize("head_dim,kv_heads,group", [(64, 3, 3), (128, 2, 4), (64, 1, 8), (128, 4, 1), (64, 2, 5)])
def test_cpp_decode_kernel_matches_sdpa(
    dtype: torch.dtype, tol: float, head_dim: int, kv_heads: int, group: int
) -> None:
    """The kernel alone against SDPA over gathered KV, ragged lengths, scattered slots; its
    log-sum-exp against the exact one."""
    kernels = _kernels(True)
    gen = torch.Generator().manual_seed(7)
    lens, slots_total = [1, 37, 5, 64, 8, 9], 400  # around the kernel's 8-key blocks
    k_pool = torch.randn(slots_total, kv_heads, head_dim, generator=gen).to(dtype)
    v_pool = torch.randn(slots_total, kv_heads, head_dim, generator=gen).to(dtype)
    slots = (torch.randperm(slots_total - 1, generator=gen)[: sum(lens)] + 1).to(torch.int64)
    indptr = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int64)
    q = torch.randn(len(lens), kv_heads * group, head_dim, generator=gen).to(dtype)
    out, lse = kernels.decode_attention(q, k_pool, v_pool, slots, indptr, head_dim**-0.5)
    assert out.dtype == dtype and lse.dtype == torch.float32 and lse.shape == (len(lens), kv_heads * group)
    for b in range(len(lens)):
        s = slots[indptr[b] : indptr[b + 1]]
        k = k_pool[s].float().repeat_interleave(group, dim=1).transpose(0, 1)  # [H, n, D]
        v = v_pool[s].float().repeat_interleave(group, dim=1).transpose(0, 1)
        qb = q[b].float()[:, None, :]  # [H, 1, D]
        want = F.scaled_dot_product_attention(qb, k, v)[:, 0]
        err = ((out[b].float() - want).norm() / want.norm()).item()
        assert err <= tol, (b, err)
        exact = torch.logsumexp((qb @ k.transpose(1, 2))[:, 0] * head_dim**-0.5, dim=-1)
        torch.testing.assert_close(lse[b], exact, rtol=1e-4, atol=1e-4)


def test_cpp_decode_kernel_refuses_shapes_it_has_no_instance_for() -> None:
    """Other head sizes or groups get a clear error from the kernel, and the backend does not
    offer them to it (kernel_supports), so they run the torch path."""
    from kernels.decode_attention import kernel_supports

    kernels = _kernels(True)
    q, pool = torch.randn(1, 6, 16), torch.randn(4, 2, 16)
    slots, indptr = torch.arange(4, dtype=torch.int64), torch.tensor([0, 4], dtype=torch.int64)
    with pytest.raises(RuntimeError, match="head_dim 64 or 128"):
        kernels.decode_attention(q, pool, pool, slots, indptr, 0.25)
    assert not kernel_supports(torch.float32, 16, 3) and not kernel_supports(torch.float32, 64, 9)
    assert kernel_supports(torch.bfloat16, 128, 8) and not kernel_supports(torch.float16, 64, 3)


@pytest.mark.parametrize("generated,decode_rows", [
    ([False, True, False], [5]),  # a mixed batch: only the decode row attends as one
    ([True, True, True], list(range(6))),  # generated extends (speculative verifies) of <= 8 tokens...
    ([False, False, False], []),  # ...but never prompt tokens, however few
])
def test_prompt_tokens_take_the_prefill_path_and_generated_ones_the_decode_path(
        generated: list[bool], decode_rows: list[int]) -> None:
    """The prefill and decode kernels sum in different orders: a prompt token must take the same
    path whether its prompt came whole or in chunks, alone or beside decodes."""
    extend_lens = [5, 1, 12]
    seq_lens = [9, 14, 12]
    pool = KVPool(LAYERS, 64, KV_HEADS, DIM, torch.float32, torch.device("cpu"), 1)
    pages = [list(range(1, 10)), list(range(10, 24)), list(range(24, 36))]
    meta = _metadata(pages, seq_lens, extend_lens, 1)
    meta.generated = generated
    backend = TorchAttentionBackend(pool, HEADS, KV_HEADS, DIM)
    backend.plan(meta)
    assert ([] if backend.mixed_rows is None else backend.mixed_rows.tolist()) == decode_rows
    one_token_prompts = _metadata(pages[:2], [9, 14], [1, 1], 1)
    one_token_prompts.generated = [False, False]
    assert not one_token_prompts.is_decode
