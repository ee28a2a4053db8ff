"""Batched sampling for requests with different parameters: one call per step for the whole batch.

Per step the model runner does:

    batch = SamplingBatch.build(params, output_ids, vocab_size, device, stop_ids)
    apply_penalties_and_bias(logits, batch)      # in place, fp32 [B, V]
    (grammar masks, if any, go here)
    out = sample(logits, batch, top_logprobs_num, return_logprob=...)

Semantics (where SGLang leaves a choice):
  - Penalties count OUTPUT tokens only, as SGLang's penalizers do; prompt tokens never count.
    Order: repetition (HF/vLLM: positive logits / r, negative logits * r), then frequency
    (- f * count), then presence (- p * [count > 0]), then logit_bias (+), then min_new_tokens
    (-inf on the row's stop ids while len(output) < min_new_tokens).
  - Greedy rows (temperature < 1e-6 or top_k == 1) take argmax of the penalized logits.
  - Other rows: probs = softmax(logits / T); top-k, top-p and min-p are computed jointly on those
    probs (SGLang's torch path) and intersected; the kept support is renormalized implicitly.
    Rows with top-k/top-p sample among a sorted candidate prefix (`topk` of a guessed width,
    widened until it provably holds each row's support), so a full sort of the vocabulary only
    happens when a support really is that wide.
  - The draw is an exponential race, argmax(p / E) with E ~ Exp(1) i.i.d. per token, which
    samples exactly from p. A seeded row takes E (one value per vocabulary id) from its own
    generator seeded by mix_seed(seed, len(output_ids)), so its token depends only on its own
    logits, parameters, seed and step, never on the rest of the batch (on one device type).
    Unseeded rows share the caller's generator, or the global RNG.
  - With the FlashInfer backend (CUDA), row groups limited by top-k / top-p and without min_p are
    drawn by its sort-free kernel instead (`truncated`, kernels/flashinfer_sampling.py): the same
    distribution and the same per-row seed independence, another draw.
  - Returned logprobs are log_softmax of the penalized/biased logits BEFORE temperature and
    filtering (the raw model distribution, as OpenAI reports), for greedy and sampled rows alike.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import chain
from typing import Protocol

import torch

from kernels.logit_bias import request_bias
from kernels.transfer import upload, upload_tensor
from runtime.contracts.sampling import SamplingParams

Device = torch.device | str
_MASK64 = (1 << 64) - 1
_FIRST_WIDTH = 256  # first candidate width tried for rows limited by top_p only
_SECOND_WIDTH = 4096  # then this, then the whole vocabulary


@dataclass
class RowGroup:
    """Live (non-greedy) rows drawn the same way: from truncated candidates or the full vocab."""

    positions: torch.Tensor | None  # int64 [G] positions among the live rows; None = all of them
    seeds: list[int | None]  # per row: generator seed already mixed with the step, or None
    truncated: bool  # some top-k / top-p limit applies to every row of the group
    top_ks: torch.Tensor  # int64 [G]; vocab_size where unlimited
    top_ps: torch.Tensor  # fp32 [G]; +inf where unlimited (top_p == 1)
    min_ps: torch.Tensor | None  # fp32 [G]; None when no row uses min_p
    width: int  # first candidate width to try


class TruncatedSampler(Protocol):
    """A device's own way to draw from top-k / top-p limited rows (kernels/flashinfer_sampling.py).

    probs fp32 [G, V]; top_k int64 [G] (V: unlimited); top_p fp32 [G] (inf: unlimited); one seed
    per row (already mixed with the step) or None. Returns int64 [G] token ids."""

    def __call__(self, probs: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor, seeds: list[int | None],
                 generator: torch.Generator | None) -> torch.Tensor: ...


@dataclass(frozen=True)
class Penalties:
    """The penalised (row, token) pairs of a step: flat indices into [B * V], fp32 values per pair."""

    index: torch.Tensor  # int64 [N] (row, token) pairs seen in the output
    count: torch.Tensor  # fp32 [N] occurrences of that token in that output
    freq: torch.Tensor  # fp32 [N] the row's frequency penalty
    pres: torch.Tensor  # fp32 [N] the row's presence penalty
    rep: torch.Tensor  # fp32 [N] the row's repetition penalty


@dataclass
class SamplingBatch:
    """Per-row sampling state for one step, built on the host once per step.

    On the all-greedy path `live_rows` is empty and nothing but argmax runs. Penalty, bias and
    block tensors are None when no row needs them; their indices are flat into [B * V]."""

    vocab_size: int
    batch_size: int
    is_all_greedy: bool
    live_rows: list[int] = field(default_factory=list)  # the non-greedy rows
    live_index: torch.Tensor | None = None  # int64 [L] the same on device; None when L == B
    temperatures: torch.Tensor | None = None  # fp32 [L, 1]
    groups: list[RowGroup] = field(default_factory=list)
    penalties: Penalties | None = None
    bias_index: torch.Tensor | None = None  # int64 [M]
    bias_value: torch.Tensor | None = None  # fp32 [M]
    block_index: torch.Tensor | None = None  # int64 [K] set to -inf (min_new_tokens)

    @property
    def needs_logit_processing(self) -> bool:
        return any(t is not None for t in (self.penalties, self.bias_index, self.block_index))

    @classmethod
    def build(
        cls,
        params: list[SamplingParams],
        output_ids: list[list[int]],
        vocab_size: int,
        device: Device,
        stop_ids: list[list[int]] | None = None,
    ) -> SamplingBatch:
        """Gather one step's per-row parameters into tensors on `device`.

        Args:
            params: one validated SamplingParams per row.
            output_ids: each row's generated tokens so far (penalties, min_new_tokens, seed step).
            vocab_size: the logits' last dimension (the model's padded vocabulary).
            stop_ids: per row, the ids blocked before min_new_tokens is reached (EOS plus
                stop_token_ids, or only stop_token_ids under ignore_eos); None: block nothing.
        """
        assert len(params) == len(output_ids), "one output_ids list per row"
        batch = cls(vocab_size, len(params), all(p.is_greedy for p in params))
        if not batch.is_all_greedy:
            batch._build_sampling(params, output_ids, torch.device(device))
        batch._build_penalties(params, output_ids, device)
        batch._build_bias(params, device)
        if stop_ids is not None:
            assert len(stop_ids) == len(params), "one stop_ids list per row"
            batch._build_block(params, output_ids, stop_ids, device)
        return batch

    def _build_sampling(
        self, params: list[SamplingParams], outs: list[list[int]], device: torch.device
    ) -> None:
        vocab = self.vocab_size
        self.live_rows = [i for i, p in enumerate(params) if not p.is_greedy]
        live = [params[i] for i in self.live_rows]
        if len(live) < len(params):
            self.live_index = upload(self.live_rows, torch.int64, device)
        temps = [[p.temperature] for p in live]
        self.temperatures = upload(temps, torch.float32, device)
        seeds = [None if p.seed is None else mix_seed(p.seed, len(outs[i]))
                 for i, p in zip(self.live_rows, live)]
        truncated = [(p.top_k >= 1 and p.top_k < vocab) or p.top_p < 1.0 for p in live]
        for kind in (True, False):
            pos = [j for j, t in enumerate(truncated) if t == kind]
            if pos:
                index = None if len(pos) == len(live) else upload(pos, torch.int64, device)
                group, group_seeds = [live[j] for j in pos], [seeds[j] for j in pos]
                self.groups.append(_row_group(group, group_seeds, index, kind, vocab, device))

    def _build_penalties(
        self, params: list[SamplingParams], outs: list[list[int]], device: Device
    ) -> None:
        rows = [i for i, p in enumerate(params) if outs[i] and (
            p.frequency_penalty != 0.0 or p.presence_penalty != 0.0 or p.repetition_penalty != 1.0)]
        if not rows:
            return
        lens = torch.tensor([len(outs[i]) for i in rows], dtype=torch.int64)
        toks = torch.tensor(list(chain.from_iterable(outs[i] for i in rows)), dtype=torch.int64)
        row_of = torch.repeat_interleave(torch.tensor(rows, dtype=torch.int64), lens)
        keys, counts = torch.unique(row_of * self.vocab_size + toks, return_counts=True)
        key_rows = keys // self.vocab_size

        def per_key(attr: str) -> torch.Tensor:
            vals = torch.tensor([getattr(p, attr) for p in params], dtype=torch.float32)
            return upload_tensor(vals[key_rows], device)

        self.penalties = Penalties(
            index=upload_tensor(keys, device),
            count=upload_tensor(counts.to(torch.float32), device),
            freq=per_key("frequency_penalty"),
            pres=per_key("presence_penalty"),
            rep=per_key("repetition_penalty"),
        )

    def _build_bias(self, params: list[SamplingParams], device: Device) -> None:
        rows = [(row, request_bias(p, self.vocab_size, torch.device(device)))
                for row, p in enumerate(params) if p.logit_bias]
        rows = [(row, t) for row, t in rows if t[0].numel()]
        if rows:
            self.bias_index = torch.cat([ids + row * self.vocab_size for row, (ids, _) in rows])
            self.bias_value = torch.cat([values for _, (_, values) in rows])

    def _build_block(
        self, params: list[SamplingParams], outs: list[list[int]], stop_ids: list[list[int]],
        device: Device,
    ) -> None:
        index = [row * self.vocab_size + tid
                 for row, (p, out, ids) in enumerate(zip(params, outs, stop_ids))
                 if len(out) < p.min_new_tokens
                 for tid in ids if 0 <= tid < self.vocab_size]
        if index:
            self.block_index = upload(index, torch.int64, device)


def _row_group(
    params: list[SamplingParams], seeds: list[int | None], positions: torch.Tensor | None,
    truncated: bool, vocab: int, device: torch.device,
) -> RowGroup:
    ks = [vocab if p.top_k < 1 else min(p.top_k, vocab) for p in params]
    needs = [k if p.top_p >= 1.0 else min(k, _FIRST_WIDTH) for k, p in zip(ks, params)]
    top_ps = [p.top_p if p.top_p < 1.0 else float("inf") for p in params]
    min_ps = None
    if any(p.min_p > 0 for p in params):
        min_ps = upload([p.min_p for p in params], torch.float32, device)
    return RowGroup(
        positions=positions,
        seeds=seeds,
        truncated=truncated,
        top_ks=upload(ks, torch.int64, device),
        top_ps=upload(top_ps, torch.float32, device),
        min_ps=min_ps,
        width=min(vocab, max(needs)) if truncated else vocab,
    )


@dataclass
class SampleOutput:
    """One step's result. `logprobs` and `top_logprobs` are None unless requested."""

    next_ids: torch.Tensor  # int64 [B]
    logprobs: torch.Tensor | None  # fp32 [B], raw (pre-temperature) log-prob of next_ids
    top_logprobs: list[tuple[list[int], list[float]]] | None  # per row: k ids, k logprobs, desc


def mix_seed(seed: int, step: int) -> int:
    """A 63-bit generator seed from (request seed, decode step): splitmix64 of the pair."""
    x = (seed * 0x9E3779B97F4A7C15 + step + 1) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return (x ^ (x >> 31)) >> 1


def apply_penalties_and_bias(logits: torch.Tensor, batch: SamplingBatch) -> None:
    """Apply repetition/frequency/presence penalties, logit_bias and min_new_tokens in place.

    `logits` is fp32 [B, V] and contiguous. Costs nothing when no row needs any of these.
    """
    if not batch.needs_logit_processing:
        return
    assert logits.dtype == torch.float32 and logits.is_contiguous(), "fp32 contiguous logits"
    assert logits.shape == (batch.batch_size, batch.vocab_size), "logits shape != batch"
    flat = logits.view(-1)
    pen = batch.penalties
    if pen is not None:
        vals = flat[pen.index]
        vals = torch.where(vals > 0, vals / pen.rep, vals * pen.rep)
        flat[pen.index] = vals - pen.freq * pen.count - pen.pres
    if batch.bias_index is not None:
        assert batch.bias_value is not None  # set together with bias_index
        flat.index_add_(0, batch.bias_index, batch.bias_value)
    if batch.block_index is not None:
        flat.index_fill_(0, batch.block_index, float("-inf"))


def sync_free(device: torch.device) -> bool:
    """Sample without reading anything back? On a GPU proving a candidate prefix wide enough reads
    a flag back (a host wait per step), which costs more than sorting the whole vocabulary there;
    on CPU the read is free and the narrow prefix saves the sort."""
    return device.type != "cpu"


def _candidates(
    probs: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    min_p: torch.Tensor | None,
    width: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's support among its `width`+ most probable tokens, widened until it fits.

    Returns (p, ids), both [B, W] sorted by descending probability: p is zero outside the support.
    top_k: int64 [B] (vocab = unlimited); top_p: [B] (inf = unlimited); min_p: [B] or None.
    """
    vocab = probs.shape[-1]
    if sync_free(probs.device):
        width = vocab
    while True:
        if width >= vocab:
            vals, ids = probs.sort(dim=-1, descending=True)
        else:
            vals, ids = probs.topk(width, dim=-1)
        before = vals.cumsum(dim=-1) - vals
        # NOTE: the tokens past the prefix are all excluded iff each row is cut by top-k inside
        # the prefix or the prefix's mass already reaches its top_p.
        mass = before[:, -1] + vals[:, -1]
        if width >= vocab or bool(((top_k <= width) | (mass >= top_p)).all()):
            break
        width = vocab if width >= _SECOND_WIDTH else min(vocab, _SECOND_WIDTH)
    keep = torch.arange(vals.shape[-1], device=probs.device) < top_k.unsqueeze(1)
    keep &= before < top_p.unsqueeze(1)
    if min_p is not None:
        keep &= vals >= min_p.unsqueeze(1) * vals[:, :1]
    keep[:, 0] = True
    return vals.masked_fill_(~keep, 0.0), ids


def filter_support(
    probs: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    min_p: torch.Tensor,
    width: int = _FIRST_WIDTH,
) -> torch.Tensor:
    """The tokens each row may sample: bool [B, V], True = kept. Always keeps the top token.

    top_k: int [B] keeps the k most probable tokens (< 1 or >= V: no limit).
    top_p: [B] keeps the smallest most-probable set whose cumulative probability >= top_p, i.e.
        a token is kept iff the mass strictly before it (in sorted order) is < top_p; 1 keeps all.
    min_p: [B] keeps tokens with p >= min_p * max(p).
    The three are computed on the same `probs` and intersected. `width` is the first candidate
    width tried (the sampler's code path; the result does not depend on it).
    """
    vocab = probs.shape[-1]
    k = torch.where((top_k < 1) | (top_k > vocab), vocab, top_k).to(torch.int64)
    p = torch.where(top_p >= 1, float("inf"), top_p.to(torch.float32))
    vals, ids = _candidates(probs, k, p, min_p.to(probs.dtype), min(width, vocab))
    return torch.zeros_like(probs, dtype=torch.bool).scatter_(1, ids, vals > 0)


def _exp_noise(
    seeds: list[int | None], width: int, ids: torch.Tensor | None, vocab: int,
    device: torch.device, generator: torch.Generator | None,
) -> torch.Tensor:
    """Exp(1) noise [G, width]; a seeded row reads its own stream at its candidate ids."""
    unseeded = [i for i, s in enumerate(seeds) if s is None]
    if len(unseeded) == len(seeds):
        u = torch.rand((len(seeds), width), generator=generator, device=device)
    else:
        u = torch.empty((len(seeds), width), device=device)
        if unseeded:
            fresh = torch.rand((len(unseeded), width), generator=generator, device=device)
            u[upload(unseeded, torch.int64, device)] = fresh
        for i, seed in enumerate(seeds):
            if seed is not None:
                gen = torch.Generator(device=device).manual_seed(seed)
                row = torch.rand(vocab, generator=gen, device=device)
                u[i] = row if ids is None else row[ids[i]]
    # NOTE: u in [0, 1) so -log(u) is in (0, inf]: never 0, so p / E is never NaN.
    return u.log_().neg_()


def _draw_group(
    probs: torch.Tensor, group: RowGroup, generator: torch.Generator | None, truncated: TruncatedSampler | None
) -> torch.Tensor:
    vocab = probs.shape[-1]
    if group.truncated and truncated is not None and group.min_ps is None:
        return truncated(probs, group.top_ks, group.top_ps, group.seeds, generator)
    if group.truncated:
        p, ids = _candidates(probs, group.top_ks, group.top_ps, group.min_ps, group.width)
    else:
        p, ids = probs, None
        if group.min_ps is not None:
            floor = group.min_ps.unsqueeze(1) * probs.amax(-1, keepdim=True)
            p = probs.masked_fill_(probs < floor, 0.0)
    noise = _exp_noise(group.seeds, p.shape[-1], ids, vocab, probs.device, generator)
    pick = (p / noise).max(dim=-1).indices
    return pick if ids is None else ids.gather(1, pick.unsqueeze(1)).squeeze(1)


def _draw(
    logits: torch.Tensor, batch: SamplingBatch, generator: torch.Generator | None, truncated: TruncatedSampler | None
) -> torch.Tensor:
    """Sample the live rows group by group; greedy rows take argmax."""
    rows = batch.live_index
    sub = logits if rows is None else logits[rows]
    assert batch.temperatures is not None  # built for every batch with a live row
    probs = torch.softmax(sub / batch.temperatures, dim=-1)
    sampled = torch.empty(len(batch.live_rows), dtype=torch.int64, device=logits.device)
    for group in batch.groups:
        pos = group.positions
        ids = _draw_group(probs if pos is None else probs[pos], group, generator, truncated)
        sampled = ids if pos is None else sampled.index_copy_(0, pos, ids)
    if rows is None:
        return sampled
    return logits.max(dim=-1).indices.index_copy_(0, rows, sampled)


def sample(
    logits: torch.Tensor,
    batch: SamplingBatch,
    top_logprobs_num: list[int] | int = 0,
    *,
    return_logprob: bool = False,
    generator: torch.Generator | None = None,
    truncated: TruncatedSampler | None = None,
) -> SampleOutput:
    """Pick one token per row.

    Args:
        logits: [B, V] after `apply_penalties_and_bias` (and any grammar mask); not modified.
        top_logprobs_num: per row (or one for all rows) how many top logprobs to return; 0 = none.
        return_logprob: also return the chosen tokens' logprobs (implied by top_logprobs_num > 0).
        generator: RNG for rows without a seed (on the logits' device); None = the global RNG.
        truncated: the device's sort-free way for top-k / top-p rows without min_p; None: ours.
    """
    assert logits.dim() == 2 and logits.shape[0] == batch.batch_size, "logits must be [B, V]"
    logits = logits.float()
    next_ids = logits.max(dim=-1).indices if batch.is_all_greedy else _draw(logits, batch, generator, truncated)
    nums = top_logprobs_num
    if not isinstance(nums, list):
        nums = [nums] * batch.batch_size
    max_num = max(nums, default=0)
    if not return_logprob and max_num <= 0:
        return SampleOutput(next_ids, None, None)
    logprobs = torch.log_softmax(logits, dim=-1)
    chosen = logprobs.gather(1, next_ids.unsqueeze(1)).squeeze(1)
    top = None
    if max_num > 0:
        vals, ids = logprobs.topk(min(max_num, logits.shape[1]), dim=-1)
        vals_l, ids_l = vals.tolist(), ids.tolist()
        top = [(ids_l[i][:k], vals_l[i][:k]) for i, k in enumerate(nums)]
    return SampleOutput(next_ids, chosen, top)
