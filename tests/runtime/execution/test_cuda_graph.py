"""Decode graphs: buckets and padding (pure), and the whole replay path on CPU with eager
stand-ins for captured graphs, against the eager step (torch backend and our FlashInfer backend
over the stand-in module)."""

from __future__ import annotations

import pytest
import torch

from runtime.contracts.sampling import SamplingParams
from runtime.execution.cuda_graph import bucket_for, capture_batch_sizes, default_max_bs, pad_entries, padding_entry
from runtime.execution.forward_batch import ForwardEntry
from tests.kernels import fake_flashinfer as fake_module
from tests.runtime.execution.tiny_runner import SHAPES, fake_flashinfer, make_runner, write_config  # noqa: F401 (a fixture)

GREEDY = SamplingParams(temperature=0.0)


def test_buckets() -> None:
    assert capture_batch_sizes(1) == [1]
    assert capture_batch_sizes(6) == [1, 2, 4, 6]
    assert capture_batch_sizes(32) == [1, 2, 4, 8, 16, 24, 32]
    assert capture_batch_sizes(36) == [1, 2, 4, 8, 16, 24, 32, 36]
    sizes = capture_batch_sizes(256)
    assert sizes[:5] == [1, 2, 4, 8, 16] and sizes[-1] == 256 and all(b - a == 8 for a, b in zip(sizes[4:], sizes[5:]))
    assert [bucket_for(n, sizes) for n in (1, 3, 8, 9, 17, 256)] == [1, 4, 8, 16, 24, 256]
    assert bucket_for(257, sizes) is None


def test_default_max_bs_follows_sglang() -> None:
    assert [default_max_bs(g) for g in (16, 24, 40, 80, 141, 180)] == [8, 24, 32, 256, 256, 512]


def test_padding_rows_compute_nothing_anyone_reads() -> None:
    real = [ForwardEntry(row=2, input_ids=[7], prefix_len=9, kv_write=[40], kv_write_start=9)]
    padded = pad_entries(real, 4, padding_row=16)
    assert padded[0] is real[0] and len(padded) == 4
    pad = padding_entry(16)
    assert all(e == pad for e in padded[1:])
    assert (pad.row, pad.input_ids, pad.prefix_len, pad.kv_write) == (16, [0], 0, [0])  # slot 0: reserved
    with pytest.raises(AssertionError):
        pad_entries(real * 5, 4, padding_row=16)


def _decode_batch(runner, lens: list[int]) -> list[ForwardEntry]:
    """Prefill len_i tokens for each of len(lens) requests, then return their decode entries."""
    entries, decodes = [], []
    for row, n in enumerate(lens):
        ids = [(row * 7 + i) % 500 + 1 for i in range(n)]
        base = 32 * (row + 1)  # page-aligned for page sizes up to 32; page 0 is padding
        slots = list(range(base, base + n + 1))
        entries.append(ForwardEntry(row=row, input_ids=ids, prefix_len=0, kv_write=slots[:n], kv_write_start=0))
        decodes.append(ForwardEntry(row=row, input_ids=[ids[-1]], prefix_len=n, kv_write=slots[n:], kv_write_start=n,
                                    sampling=GREEDY))
    runner.forward(entries)
    return decodes


@pytest.mark.parametrize("backend", ["torch", "fake-flashinfer"])
def test_graph_replay_matches_eager(tmp_path, backend: str, request) -> None:
    if backend == "fake-flashinfer":
        request.getfixturevalue("fake_flashinfer")
    path = write_config(tmp_path / "m", *SHAPES["qwen2-group7"])
    dtype = "bfloat16" if backend == "fake-flashinfer" else "float32"  # FlashInfer has no fp32 kernels
    runner = make_runner(path, backend=backend, page_size=4, dtype=dtype)
    decodes = _decode_batch(runner, [5, 9, 3])
    eager = runner.forward(decodes, keep_logits=True)
    eager_meta = runner.backend.meta
    runner.init_cuda_graphs(8, capture=False)
    assert runner.graphs is not None and runner.graphs.sizes == [1, 2, 4, 8]
    graph = runner.forward(decodes, keep_logits=True)  # 3 rows in the bucket of 4
    graph_meta = runner.backend.meta
    assert graph.host_next_ids() == eager.host_next_ids()
    torch.testing.assert_close(graph.last_logits, eager.last_logits, rtol=1e-4, atol=1e-4)
    # The real rows' metadata is the eager step's; the padding row attends to page 0 only.
    assert graph_meta.seq_lens == eager_meta.seq_lens + [1]
    assert graph_meta.kv_indptr_host.tolist()[:4] == eager_meta.kv_indptr_host.tolist()
    real_pages = eager_meta.kv_indptr_host.tolist()[-1]
    assert torch.equal(graph_meta.kv_indices[:real_pages], eager_meta.kv_indices)
    assert graph_meta.kv_indices[real_pages:].tolist() == [0]
    assert torch.equal(graph_meta.positions[:3], eager_meta.positions)
    assert graph_meta.out_cache_loc.tolist() == eager_meta.out_cache_loc.tolist() + [0]
    if backend == "fake-flashinfer":
        kind, args = fake_module.PLANS[-1]
        assert kind == "decode" and len(args["last_page_len"]) == 4  # the bucket's fixed batch size


def test_prefill_and_oversized_batches_run_eagerly(tmp_path) -> None:
    path = write_config(tmp_path / "m", *SHAPES["smollm2"])
    runner = make_runner(path)
    runner.init_cuda_graphs(2, capture=False)
    decodes = _decode_batch(runner, [4, 4, 4])
    assert runner.graphs is not None
    assert not runner.graphs.can_run(decodes)  # 3 rows > the largest bucket
    assert runner.graphs.can_run(decodes[:2])
    scoring = ForwardEntry(row=0, input_ids=[3], prefix_len=4, kv_write=[99], kv_write_start=4, logprob_targets=[5])
    assert not runner.graphs.can_run([scoring])
    assert len(runner.forward(decodes).host_next_ids()) == 3
