"""CUDA graphs for decode: one graph per batch-size bucket, replayed with the batch padded to it.

A decode step of a 0.5-8B model launches hundreds of small kernels; at small batch the GPU waits
on the host launching them. A captured graph replays them with one launch. What a graph needs:
- static inputs: the token ids, positions and KV write slots live in buffers sized for the
  largest bucket, refilled before each replay (a graph reads fixed addresses);
- a fixed batch size: a batch of B rows runs in the smallest bucket >= B, its extra rows padding
  (token 0 at position 0 of the reserved padding row, writing the reserved KV slot 0, attending to
  page 0 only), their outputs dropped;
- attention planned outside the graph: FlashInfer's CUDA-graph decode wrappers (one per bucket,
  with fixed index buffers) are planned on the host before each replay and capture only the run.
Capture happens once at start, after the KV pool is sized, largest bucket first (its memory pool
is then reused by the smaller ones), and anything a graph cannot take runs eagerly: prefill,
mixed batches, input-token logprobs, batches above the largest bucket.

The bucket choice and the padding are pure and tested on CPU, and so is the whole replay path:
`EagerGraph` stands in for a captured graph there (it reruns the captured function).
"""

from __future__ import annotations

import bisect
import dataclasses
import functools
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

import torch

from kernels.base import AttentionBackend
from kernels.kv_pool import ReqToTokenPool
from runtime.execution.forward_batch import ForwardEntry
from runtime.execution.step_inputs import StepInputs

if TYPE_CHECKING:
    from torch.cuda import _POOL_HANDLE

    from runtime.models.base import CausalLM

logger = logging.getLogger("radixserve.cuda_graph")

SMALL_BUCKETS = (1, 2, 4, 8)
BUCKET_STEP = 8


def capture_batch_sizes(max_bs: int) -> list[int]:
    """1, 2, 4, 8, then every 8 up to max_bs, and max_bs itself."""
    assert max_bs >= 1, max_bs
    sizes = [b for b in SMALL_BUCKETS if b <= max_bs]
    sizes += list(range(2 * BUCKET_STEP, max_bs + 1, BUCKET_STEP))
    if sizes[-1] != max_bs:
        sizes.append(max_bs)
    return sizes


def default_max_bs(gpu_memory_gib: float) -> int:
    """SGLang's default `cuda_graph_max_bs` for one GPU (tp < 4), by the GPU's memory."""
    for below, max_bs in ((20, 8), (35, 24), (60, 32), (160, 256)):
        if gpu_memory_gib < below:
            return max_bs
    return 512


def bucket_for(batch_size: int, sizes: list[int]) -> int | None:
    """The smallest captured size >= batch_size, or None when the batch is too large."""
    i = bisect.bisect_left(sizes, batch_size)
    return sizes[i] if i < len(sizes) else None


def padding_entry(padding_row: int) -> ForwardEntry:
    """A row that computes nothing anyone reads: token 0 at position 0, KV in the reserved slot 0."""
    return ForwardEntry(row=padding_row, input_ids=[0], prefix_len=0, kv_write=[0], kv_write_start=0)


def pad_entries(entries: list[ForwardEntry], bucket: int, padding_row: int) -> list[ForwardEntry]:
    assert len(entries) <= bucket, (len(entries), bucket)
    return entries + [padding_entry(padding_row)] * (bucket - len(entries))


def is_graph_decode(entries: list[ForwardEntry]) -> bool:
    """A batch a decode graph can run: one new token per row and no input-token logprobs."""
    return all(len(e.input_ids) == 1 and not e.logprob_targets for e in entries)


class Graph(Protocol):
    def replay(self) -> None: ...


class EagerGraph:
    """Runs the 'captured' function again at each replay: the CPU stand-in for a CUDA graph."""

    def __init__(self, fn: Callable[[], None]) -> None:
        self.fn = fn
        fn()

    def replay(self) -> None:
        self.fn()


class CapturedGraph:
    """A torch.cuda.CUDAGraph of `fn`, after warm-up runs on a side stream (as torch requires)."""

    def __init__(self, fn: Callable[[], None], pool: _POOL_HANDLE | None, stream: torch.cuda.Stream | None) -> None:
        for _ in range(2):
            fn()
        torch.cuda.synchronize()
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph, pool=pool, stream=stream):
            fn()

    def replay(self) -> None:
        self.graph.replay()


class GraphHost(Protocol):
    """What the graphs use of the ModelRunner that owns them (which imports this module)."""

    model: CausalLM
    backend: AttentionBackend
    device: torch.device
    page_size: int
    req_to_token: ReqToTokenPool

    def prepare(self, entries: list[ForwardEntry], page_list: torch.Tensor | None = None) -> StepInputs: ...


class CudaGraphRunner:
    """The decode graphs of one ModelRunner: static buffers, capture, padded replay.

    `capture=False` builds the same buffers and buckets with `EagerGraph`s (CPU tests, the dry run).
    """

    def __init__(self, runner: GraphHost, max_bs: int, capture: bool) -> None:
        self.runner = runner
        self.sizes = capture_batch_sizes(max_bs)
        largest = self.sizes[-1]
        device = runner.device
        self.input_ids = torch.zeros(largest, dtype=torch.int64, device=device)
        self.positions = torch.zeros(largest, dtype=torch.int64, device=device)
        self.out_cache_loc = torch.zeros(largest, dtype=torch.int64, device=device)
        self.padding_row = runner.req_to_token.padding_row
        # One fp32 logits buffer for every bucket (a bucket of B writes its first B rows): each
        # graph keeping its own [B, vocab] output would hold ~2 GB over 35 buckets at a 128k vocab.
        self.logits = torch.empty(largest, runner.model.global_config.vocab_size, dtype=torch.float32, device=device)
        self.graphs: dict[int, Graph] = {}
        table_width = runner.req_to_token.max_context_len
        runner.backend.init_cuda_graph(self.sizes, largest * (table_width // runner.page_size))
        self._capture(capture)

    def can_run(self, entries: list[ForwardEntry]) -> bool:
        return len(entries) <= self.sizes[-1] and is_graph_decode(entries)

    def prepare(self, entries: list[ForwardEntry]) -> StepInputs:
        """Pad `entries` to their bucket, fill the static buffers and plan the bucket's attention:
        all the host work before replay()."""
        bucket = bucket_for(len(entries), self.sizes)
        assert bucket is not None, len(entries)
        return self.load(pad_entries(entries, bucket, self.padding_row))

    def replay(self, step: StepInputs, batch: int) -> torch.Tensor:
        """Replay the graph of the prepared `step`: the first `batch` rows' fp32 logits [B, V], a
        view of the shared buffer the next replay overwrites."""
        bucket = len(step.rows)
        self.graphs[bucket].replay()
        return self.logits[:batch]

    def load(self, padded: list[ForwardEntry]) -> StepInputs:
        """Prepare a bucket-sized batch, fill the static buffers and plan the bucket's attention."""
        size = len(padded)
        step = self.runner.prepare(padded, self.runner.backend.graph_page_list())
        self.input_ids[:size].copy_(step.input_ids)
        self.positions[:size].copy_(step.meta.positions)
        self.out_cache_loc[:size].copy_(step.meta.out_cache_loc)
        meta = dataclasses.replace(step.meta, positions=self.positions[:size], out_cache_loc=self.out_cache_loc[:size])
        self.runner.backend.plan_cuda_graph(size, meta)
        return step

    def _forward(self, size: int) -> None:
        model = self.runner.model
        hidden = model.forward(self.input_ids[:size], self.positions[:size], self.runner.backend)
        self.logits[:size].copy_(model.compute_logits(hidden))

    def _capture(self, capture: bool) -> None:
        pool = torch.cuda.graph_pool_handle() if capture else None
        stream = torch.cuda.Stream(self.runner.device) if capture else None
        for size in reversed(self.sizes):  # largest first: the smaller ones reuse its pool
            self.load([padding_entry(self.padding_row)] * size)
            fn = functools.partial(self._forward, size)
            self.graphs[size] = CapturedGraph(fn, pool, stream) if capture else EagerGraph(fn)
        logger.info("decode graphs %s for batch sizes %s", "captured" if capture else "(eager stand-ins)", self.sizes)
