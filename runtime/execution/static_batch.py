"""A static-batch driver of the ModelRunner, without a scheduler: for benchmarks, tests, the demo.

It plays the scheduler's part for a fixed set of sequences: each owns one request-slot row and a
list of KV slots (whole pages), and grows by one page whenever a step crosses a page end. No
prefix cache, no admission control: the caller sizes the pool.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from radix.allocator import KVAllocator
from runtime.contracts.config import ServerConfig
from runtime.contracts.sampling import SamplingParams
from runtime.execution.forward_batch import ForwardEntry
from runtime.execution.model_runner import ForwardResult, ModelRunner
from runtime.execution.model_setup import load_model_for_serving
from runtime.execution.resolve import resolve_config


@dataclass
class Seq:
    tokens: list[int]
    row: int
    kv: list[int] = field(default_factory=list)  # KV slot of every position, page by page
    computed: int = 0  # tokens whose KV is in the pool
    output: list[int] = field(default_factory=list)


class StaticBatch:
    def __init__(self, runner: ModelRunner) -> None:
        self.runner = runner
        self.ps = runner.page_size
        self.allocator = KVAllocator(runner.kv_pool.num_slots, self.ps)

    @classmethod
    def create(cls, model_path: str, **config: object) -> StaticBatch:
        cfg = resolve_config(ServerConfig(model_path=model_path, device="cpu", **config))  # type: ignore[arg-type]
        return cls(ModelRunner(load_model_for_serving(cfg)))

    def new_seq(self, tokens: list[int]) -> Seq:
        row = self.runner.req_to_token.alloc()
        assert row is not None
        return Seq(list(tokens), row)

    def _grow(self, seq: Seq, length: int) -> None:
        missing = -(-length // self.ps) * self.ps - len(seq.kv)
        if missing > 0:
            slots = self.allocator.alloc(missing)
            assert slots is not None, "KV pool exhausted"
            seq.kv.extend(slots)

    def entry(self, seq: Seq, upto: int, sampling: SamplingParams | None = None) -> ForwardEntry:
        """Compute tokens [seq.computed, upto) of the sequence."""
        self._grow(seq, upto)
        start = seq.computed
        return ForwardEntry(
            row=seq.row,
            input_ids=seq.tokens[start:upto],
            prefix_len=start,
            kv_write=seq.kv[start:upto],
            kv_write_start=start,
            sampling=sampling or SamplingParams(temperature=0.0),
            output_ids=list(seq.output),
            generated=start >= len(seq.tokens) - len(seq.output),
        )

    def step(self, seqs: list[Seq], chunk: int | None = None, **kw: object) -> ForwardResult:
        """One forward over all seqs: each computes up to `chunk` (default: all) pending tokens."""
        entries = []
        for s in seqs:
            upto = len(s.tokens) if chunk is None else min(len(s.tokens), s.computed + chunk)
            entries.append(self.entry(s, upto))
        result = self.runner.forward(entries, **kw)  # type: ignore[arg-type]
        for s, e in zip(seqs, entries):
            s.computed = e.seq_len
        return result

    def append(self, seqs: list[Seq], result: ForwardResult) -> None:
        """Append each sequence's sampled token (only for sequences that finished their prompt)."""
        for s, tok in zip(seqs, result.host_next_ids()):
            if s.computed == len(s.tokens):
                s.tokens.append(tok)
                s.output.append(tok)

    def generate_greedy(self, prompts: list[list[int]], max_new: int) -> list[list[int]]:
        seqs = [self.new_seq(p) for p in prompts]
        for _ in range(max_new):
            self.append(seqs, self.step(seqs))
        self.release(seqs)
        return [s.output for s in seqs]

    def release(self, seqs: list[Seq]) -> None:
        """Give back the sequences' rows and KV slots."""
        for s in seqs:
            self.allocator.free(s.kv)
            self.runner.req_to_token.free(s.row)
            s.kv = []

