"""FlashInfer's sort-free top-k/top-p draws (over the stand-in): inside each row's support, a
seeded row's token fixed by its seed and step whatever the batch, and the sampler used only for
truncated row groups without min_p."""

from __future__ import annotations

import torch

from kernels.flashinfer_sampling import FlashInferTruncatedSampler
from kernels.sampling import SamplingBatch, sample
from runtime.contracts.sampling import SamplingParams
from tests.runtime.execution.tiny_runner import fake_flashinfer  # noqa: F401 (a fixture)

VOCAB = 64


def _probs(rows: int, seed: int = 0) -> torch.Tensor:
    return torch.softmax(torch.randn(rows, VOCAB, generator=torch.Generator().manual_seed(seed)) * 3, dim=-1)


def test_draws_stay_in_the_joint_support(fake_flashinfer) -> None:  # noqa: F811
    sampler = FlashInferTruncatedSampler(fake_flashinfer)
    probs = _probs(3)
    top_k = torch.tensor([2, VOCAB, 5])
    top_p = torch.tensor([float("inf"), 0.5, 0.9])  # inf: unlimited, as kernels/sampling.py keeps it
    order = probs.argsort(dim=-1, descending=True)
    mass_before = probs.gather(1, order).cumsum(-1) - probs.gather(1, order)
    allowed = [set(order[0, :2].tolist()), set(order[1][mass_before[1] < 0.5].tolist()),
               set(order[2, :5][mass_before[2, :5] < 0.9].tolist())]
    for _ in range(30):
        ids = sampler(probs, top_k, top_p, [None, None, None], None)
        assert ids.dtype == torch.int64
        assert all(int(t) in allowed[i] for i, t in enumerate(ids)), (ids, allowed)


def test_a_seeded_row_draws_the_same_token_in_any_batch(fake_flashinfer) -> None:  # noqa: F811
    sampler = FlashInferTruncatedSampler(fake_flashinfer)
    probs = _probs(3, seed=1)
    k, p = torch.tensor([VOCAB] * 3), torch.tensor([0.95] * 3)
    alone = sampler(probs[1:2], k[:1], p[:1], [2**64 - 5], None)  # a seed past int64: same bits
    for _ in range(5):
        batch = sampler(probs, k, p, [None, 2**64 - 5, 17], None)
        assert int(batch[1]) == int(alone[0])


def test_the_runner_way_takes_truncated_rows_only(fake_flashinfer) -> None:  # noqa: F811
    calls: list[int] = []
    inner = FlashInferTruncatedSampler(fake_flashinfer)

    def counted(probs, top_k, top_p, seeds, generator):  # type: ignore[no-untyped-def]
        calls.append(len(seeds))
        return inner(probs, top_k, top_p, seeds, generator)

    params = [SamplingParams(temperature=0.7, top_p=0.9), SamplingParams(temperature=0.0),
              SamplingParams(temperature=1.0), SamplingParams(temperature=0.7, top_k=4)]
    logits = torch.randn(4, VOCAB, generator=torch.Generator().manual_seed(3))
    out = sample(logits, SamplingBatch.build(params, [[]] * 4, VOCAB, "cpu"), truncated=counted)
    assert calls == [2]  # the top-p and top-k rows; not the greedy one, not the untruncated one
    assert int(out.next_ids[1]) == int(logits[1].argmax())
    calls.clear()
    params[3] = SamplingParams(temperature=0.7, top_k=4, min_p=0.1)  # the kernel has no min_p:
    sample(logits, SamplingBatch.build(params, [[]] * 4, VOCAB, "cpu"), truncated=counted)
    assert calls == []  # the truncated group stays on the torch way
