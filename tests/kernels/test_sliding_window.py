"""Sliding-window (and soft-capped) attention on every CPU path, against a plain masked softmax.

The reference below is written from the definition (Hugging Face's sliding-window mask: a query
at position q sees keys p with q - window < p <= q), not from any backend's arithmetic. Windows
are taken around the boundaries: 1 (a token sees only itself), just under, at and just over the
sequence lengths, and 48-row tiles of the C++ prefill kernel whose rows see no key of a block.
"""

from __future__ import annotations

import pytest
import torch

from kernels.base import AttentionOptions, ForwardMetadata
from kernels.kv_pool import KVPool
from kernels.sliding_window import PerLayerBackend, last_keys
from kernels.torch_backend import TorchAttentionBackend
from tests.kernels.test_attention_backends import _kernels, _metadata

CPU = torch.device("cpu")
D = 64  # a head size our C++ kernels have instances for


def reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_pos: list[int], window: int | None,
              scale: float, softcap: float | None = None) -> torch.Tensor:
    """q [e, H, D] at positions q_pos over the whole sequence's k, v [n, KVH, D] -> [e, H * D], fp64."""
    group = q.shape[1] // k.shape[1]
    qd, kd, vd = (t.double().transpose(0, 1) for t in (q, k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)))
    scores = qd @ kd.transpose(1, 2) * scale
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    keys, queries = torch.arange(k.shape[0])[None, :], torch.tensor(q_pos)[:, None]
    seen = keys <= queries
    if window is not None:
        seen &= keys > queries - window
    probs = torch.softmax(scores.masked_fill(~seen, float("-inf")), dim=-1)
    return (probs @ vd).transpose(0, 1).reshape(q.shape[0], -1)


def _setup(seq_lens: list[int], extend_lens: list[int], heads: int, kv_heads: int, ps: int, seed: int = 0):
    """A pool holding each request's cached prefix, its metadata, and every request's q, k, v."""
    gen = torch.Generator().manual_seed(seed)
    pages_needed = sum(-(-n // ps) for n in seq_lens)
    pool = KVPool(1, (pages_needed + 2) * ps, kv_heads, D, torch.float32, CPU, ps)
    perm = (torch.randperm(pages_needed + 1, generator=gen) + 1).tolist()
    page_lists = []
    for n in seq_lens:
        page_lists.append(perm[: -(-n // ps)])
        perm = perm[-(-n // ps) :]
    meta = _metadata(page_lists, seq_lens, extend_lens, ps)
    ks = [torch.randn(n, kv_heads, D, generator=gen) for n in seq_lens]
    vs = [torch.randn(n, kv_heads, D, generator=gen) for n in seq_lens]
    for pages, n, e, k, v in zip(page_lists, seq_lens, extend_lens, ks, vs):
        slots = torch.tensor([p * ps + o for p in pages for o in range(ps)][: n - e], dtype=torch.int64)
        pool.write(0, slots, k[: n - e], v[: n - e])
    q = torch.randn(sum(extend_lens), heads, D, generator=gen) * 2  # sharp softmaxes: a stray key shows
    return pool, meta, q, ks, vs


def _run(backend: TorchAttentionBackend, meta: ForwardMetadata, q: torch.Tensor, ks: list[torch.Tensor],
         vs: list[torch.Tensor]) -> torch.Tensor:
    backend.plan(meta)
    new_k = torch.cat([k[n - e :] for k, n, e in zip(ks, meta.seq_lens, meta.extend_lens)])
    new_v = torch.cat([v[n - e :] for v, n, e in zip(vs, meta.seq_lens, meta.extend_lens)])
    return backend.forward(0, q, new_k, new_v)


def _expected(meta: ForwardMetadata, q: torch.Tensor, ks: list[torch.Tensor], vs: list[torch.Tensor],
              window: int | None, scale: float, softcap: float | None = None) -> torch.Tensor:
    rows, start = [], 0
    for n, e, k, v in zip(meta.seq_lens, meta.extend_lens, ks, vs):
        rows.append(reference(q[start : start + e], k, v, list(range(n - e, n)), window, scale, softcap))
        start += e
    return torch.cat(rows)


# (seq_lens, extend_lens): a prefill with a cached prefix, decode rows, and a mix of both.
BATCHES = {
    "prefill": ([20, 13, 9], [20, 6, 9]),
    "decode": ([20, 13, 9, 1], [1, 1, 1, 1]),
    "mixed": ([20, 13, 9], [1, 13, 1]),
}


@pytest.mark.parametrize("use_kernels", [False, True], ids=["torch", "cpp"])
@pytest.mark.parametrize("page_size", [1, 4])
@pytest.mark.parametrize("batch", list(BATCHES))
@pytest.mark.parametrize("window", [1, 8, 9, 12, 13, 19, 20, 21, None])
def test_windowed_attention_matches_the_masked_softmax(batch: str, window: int | None, page_size: int,
                                                      use_kernels: bool) -> None:
    seq_lens, extend_lens = BATCHES[batch]
    pool, meta, q, ks, vs = _setup(seq_lens, extend_lens, 4, 2, page_size)
    backend = TorchAttentionBackend(pool, 4, 2, D, _kernels(use_kernels), options=AttentionOptions(window=window))
    assert (backend.extend_kernel is not None) == use_kernels
    got = _run(backend, meta, q, ks, vs)
    want = _expected(meta, q, ks, vs, window, D**-0.5)
    torch.testing.assert_close(got.double(), want, atol=2e-5, rtol=2e-5)


@pytest.mark.parametrize("use_kernels", [False, True], ids=["torch", "cpp"])
@pytest.mark.parametrize("window", [3, 8, 9])
def test_chunked_prefill_sees_earlier_chunks_within_the_window(window: int, use_kernels: bool) -> None:
    """A prompt computed in chunks (each over the KV of those before) gives the whole prompt's rows."""
    n = 30
    pool, meta, q, ks, vs = _setup([n], [n], 4, 2, 1, seed=3)
    whole = reference(q, ks[0], vs[0], list(range(n)), window, D**-0.5)
    backend = TorchAttentionBackend(pool, 4, 2, D, _kernels(use_kernels), options=AttentionOptions(window=window))
    slots = [int(s) for s in meta.out_cache_loc]
    for start, end in ((0, 7), (7, 16), (16, 30)):  # chunks both shorter and longer than the window
        chunk_meta = _metadata([slots[:end]], [end], [end - start], 1)
        got = _run(backend, chunk_meta, q[start:end].contiguous(), [ks[0][:end]], [vs[0][:end]])
        torch.testing.assert_close(got.double(), whole[start:end], atol=2e-5, rtol=2e-5)


@pytest.mark.parametrize("heads,kv_heads", [(2, 2), (6, 2)])
@pytest.mark.parametrize("window", [1, 5, 33, 47, 48, 49])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cpp_prefill_kernel_window_boundaries(heads: int, kv_heads: int, window: int, dtype: torch.dtype) -> None:
    """The C++ kernel alone, over 48-row tiles and 32-key blocks: with one query head per KV head
    a tile's last rows see no key of its first block when the window is short."""
    kernels = _kernels(True)
    gen = torch.Generator().manual_seed(5)
    n, prefix = 130, 40
    k_pool, v_pool = (torch.randn(n + 1, kv_heads, D, generator=gen).to(dtype) for _ in range(2))
    q = (torch.randn(n - prefix, heads, D, generator=gen) * 2).to(dtype)
    slots = torch.arange(1, n + 1)
    out = torch.empty_like(q)
    indptr = lambda *xs: torch.tensor(xs, dtype=torch.int64)  # noqa: E731
    kernels.prefill_attention(q, k_pool, v_pool, slots, indptr(0, n - prefix), indptr(0, n), D**-0.5, out, window)
    want = reference(q.float(), k_pool[1:].float(), v_pool[1:].float(), list(range(prefix, n)), window, D**-0.5)
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(out.double().reshape(want.shape), want, atol=tol, rtol=tol)


@pytest.mark.parametrize("batch", list(BATCHES))
@pytest.mark.parametrize("window", [4, None])
def test_soft_capped_attention(batch: str, window: int | None) -> None:
    """Gemma 2's soft cap (and its scale), on the torch paths it forces."""
    seq_lens, extend_lens = BATCHES[batch]
    pool, meta, q, ks, vs = _setup(seq_lens, extend_lens, 4, 2, 1)
    options = AttentionOptions(scale=0.3, softcap=2.5, window=window)
    backend = TorchAttentionBackend(pool, 4, 2, D, _kernels(True), cascade=True, options=options)
    assert backend.extend_kernel is None and backend.decoder.kernels is None and not backend.decoder.cascade
    got = _run(backend, meta, q, ks, vs)
    torch.testing.assert_close(got.double(), _expected(meta, q, ks, vs, window, 0.3, 2.5), atol=2e-5, rtol=2e-5)


def test_per_layer_backend_routes_each_layer_to_its_window() -> None:
    seq_lens, extend_lens = BATCHES["mixed"]
    pool, meta, q, ks, vs = _setup(seq_lens, extend_lens, 4, 2, 1)
    pool = KVPool(2, pool.k[0].shape[0], 2, D, torch.float32, CPU, 1)  # two layers, same prefix in both
    for layer in range(2):
        pool.k[layer].copy_(_setup(seq_lens, extend_lens, 4, 2, 1)[0].k[0])
        pool.v[layer].copy_(_setup(seq_lens, extend_lens, 4, 2, 1)[0].v[0])
    make = lambda w: TorchAttentionBackend(pool, 4, 2, D, _kernels(True), options=AttentionOptions(window=w))  # noqa: E731
    backend = PerLayerBackend({5: make(5), None: make(None)}, (5, None))
    backend.plan(meta)
    new_k = torch.cat([k[n - e :] for k, n, e in zip(ks, seq_lens, extend_lens)])
    new_v = torch.cat([v[n - e :] for v, n, e in zip(vs, seq_lens, extend_lens)])
    for layer, window in enumerate((5, None)):
        got = backend.forward(layer, q, new_k, new_v)
        torch.testing.assert_close(got.double(), _expected(meta, q, ks, vs, window, D**-0.5), atol=2e-5, rtol=2e-5)


def test_decode_rows_keep_their_last_window_slots() -> None:
    slots = torch.arange(10, 22)
    kept, lens = last_keys(slots, [5, 7], 3)
    assert kept.tolist() == [12, 13, 14, 19, 20, 21] and lens == [3, 3]
    assert last_keys(slots, [5, 7], 7)[0] is slots and last_keys(slots, [5, 7], None)[1] == [5, 7]


def test_decode_kernel_inputs_hold_the_windowed_slots() -> None:
    """The C++ decode stack reads the backend's decode slots: with a window, only the last keys."""
    pool, meta, q, ks, vs = _setup(*BATCHES["decode"], 4, 2, 1)
    backend = TorchAttentionBackend(pool, 4, 2, D, _kernels(True), options=AttentionOptions(window=6))
    backend.plan(meta)
    inputs = backend.decode_kernel_inputs()
    assert inputs is not None and inputs.indptr.tolist() == [0, 6, 12, 18, 19]
    per_layer = PerLayerBackend({6: backend, None: TorchAttentionBackend(pool, 4, 2, D, _kernels(True))}, (6, None))
    per_layer.plan(meta)
    assert per_layer.decode_kernel_inputs() is None  # layers would need different slots


@pytest.mark.parametrize("heads,kv_heads", [(2, 2), (9, 3)])
@pytest.mark.parametrize("window", [5, 40])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cpp_prefill_rows_do_not_depend_on_chunking_with_a_window(heads: int, kv_heads: int, window: int,
                                                                   dtype: torch.dtype) -> None:
    """Batch invariance (as tests/kernels/csrc/test_prefill_attention.py checks it without a
    window): a row computed whole or in a chunk over the cached rows before it, bit for bit."""
    kernels = _kernels(True)
    gen = torch.Generator().manual_seed(9)
    n = 101
    k_pool, v_pool = (torch.randn(n + 1, kv_heads, D, generator=gen).to(dtype) for _ in range(2))
    q = torch.randn(n, heads, D, generator=gen).to(dtype)
    slots = torch.arange(1, n + 1)
    indptr = lambda *xs: torch.tensor(xs, dtype=torch.int64)  # noqa: E731
    whole = torch.empty_like(q)
    kernels.prefill_attention(q, k_pool, v_pool, slots, indptr(0, n), indptr(0, n), D**-0.5, whole, window)
    for start in (1, 5, 32, 47, 48, 64, 100):
        chunk = torch.empty_like(q[start:])
        kernels.prefill_attention(q[start:].contiguous(), k_pool, v_pool, slots, indptr(0, n - start), indptr(0, n),
                                  D**-0.5, chunk, window)
        assert torch.equal(chunk, whole[start:]), start
