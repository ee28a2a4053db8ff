"""A pure-Python stand-in for the model runner (scheduler/interfaces.py's `Runner`), so scheduling
logic is tested in milliseconds without torch.

The fake keeps what the real runner keeps: a request table (row -> KV slot of each position), a
KV pool (slot -> the token whose K/V it holds) and the future map (row -> last sampled token).
Each entry's sequence is read back *through its KV slots*, and the "model" is a deterministic
function of that sequence. So a wrong slot, a slot freed while still in use, a stale row or a
wrong future-map read changes the tokens, and a test comparing with `reference()` sees it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from runtime.contracts.config import ServerConfig
from runtime.execution.forward_batch import ForwardEntry
from scheduler.grammar_queue import GrammarQueue
from scheduler.scheduler import Scheduler
from tests.scheduler.io_helpers import FakeIO

VOCAB = 300
EOS = 2
Model = Callable[[Sequence[int]], int]
TopK = tuple[list[int], list[float]]


def hash_model(seq: Sequence[int]) -> int:
    """The default fake model: every token depends on the whole sequence; never 0..EOS."""
    h = 0
    for t in seq:
        h = (h * 1_000_003 + t + 1) % (1 << 61)
    return EOS + 1 + h % (VOCAB - EOS - 1)


def periodic_model(period: int) -> Model:
    """A model that repeats the sequence with `period` (n-gram drafts are then often right)."""
    def model(seq: Sequence[int]) -> int:
        return seq[-period] if len(seq) >= period else hash_model(seq)
    return model


def masked_pick(token: int, allowed: Any) -> int:
    """The "model's" token if the mask allows it, else the smallest allowed one."""
    return token if token in allowed else min(allowed)


def reference(prompt: list[int], n: int, model: Model = hash_model) -> list[int]:
    """What greedy decoding of `n` tokens must produce, computed without any scheduling."""
    seq = list(prompt)
    for _ in range(n):
        seq.append(model(seq))
    return seq[len(prompt):]


class FakeRows:
    """The request-slot table's free-row list (kernels.kv_pool.ReqToTokenPool without tensors)."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.free_rows: list[int] = list(range(size))

    def alloc(self) -> int | None:
        return self.free_rows.pop() if self.free_rows else None

    def free(self, row: int) -> None:
        assert 0 <= row < self.size and row not in self.free_rows, f"bad free of row {row}"
        self.free_rows.append(row)

    def available(self) -> int:
        return len(self.free_rows)

    def check_integrity(self) -> None:
        assert len(set(self.free_rows)) == len(self.free_rows), "request rows freed twice"


@dataclass
class FakePool:
    num_slots: int


@dataclass
class FakeResult:
    next_ids: list[int]
    logprobs: list[float] | None
    top_logprobs: list[TopK] | None
    input_logprobs: list[list[float] | None]
    input_top_logprobs: list[list[TopK] | None]
    accepted: list[list[int]] | None = None
    embeddings: list[list[float] | None] | None = None

    def host_next_ids(self) -> list[int]:
        return list(self.next_ids)

    def host_logprobs(self) -> list[float] | None:
        return self.logprobs


def fake_logprob(token: int) -> float:
    return -1.0 / (token + 1)


@dataclass
class FakeRunner:
    num_slots: int
    rows: int
    model: Model = hash_model
    vocab_size: int = VOCAB
    forward_s: float = 0.0
    forward_count: int = 0
    table: dict[int, list[int]] = field(default_factory=dict)  # row -> slot of each position
    slot_token: dict[int, int] = field(default_factory=dict)  # slot -> token its K/V belongs to
    future: dict[int, int] = field(default_factory=dict)  # row -> the token it sampled last
    log: list[list[ForwardEntry]] = field(default_factory=list)  # every batch, in order

    def __post_init__(self) -> None:
        self.kv_pool = FakePool(self.num_slots)
        self.req_to_token = FakeRows(self.rows)

    def forward(self, entries: list[ForwardEntry], keep_logits: bool = False) -> FakeResult:
        self.forward_count += 1
        self.log.append(entries)
        next_ids, accepted = [], []
        embeddings: list[list[float] | None] = []
        for e in entries:
            seq = self._write(e)
            embeddings.append([float(t) for t in seq] if e.embed else None)  # the tokens its KV holds
            drafts = e.draft_ids or []
            kept = self._verify(seq, e.prefix_len, drafts)
            accepted.append(kept)
            token = self.model(seq[: e.prefix_len + 1 + len(kept)] if drafts else seq)
            if e.token_bitmask is not None:  # a fake grammar's mask: the set of allowed ids
                token = masked_pick(token, e.token_bitmask)
            self.future[e.row] = token
            next_ids.append(token)
        want_lp = any(e.return_logprob for e in entries)
        return FakeResult(
            next_ids=next_ids,
            logprobs=[fake_logprob(t) for t in next_ids] if want_lp else None,
            top_logprobs=[([t], [fake_logprob(t)]) for t in next_ids] if any(e.top_logprobs_num for e in entries)
            else None,
            input_logprobs=[None if e.logprob_targets is None else [fake_logprob(t) for t in e.logprob_targets]
                            for e in entries],
            input_top_logprobs=[None for _ in entries],
            accepted=accepted if any(e.draft_ids for e in entries) else None,
            embeddings=embeddings if any(e.embed for e in entries) else None,
        )

    def _write(self, e: ForwardEntry) -> list[int]:
        """Write the entry's slots and tokens; return its whole sequence, read through its KV."""
        row = self.table.setdefault(e.row, [])
        assert e.kv_write_start <= len(row), f"row {e.row}: positions before {e.kv_write_start} unwritten"
        assert len(e.kv_write) == e.seq_len - e.kv_write_start, "kv_write must cover the new positions"
        assert all(0 < s < self.num_slots for s in e.kv_write), f"slot out of the pool: {e.kv_write}"
        del row[e.kv_write_start:]
        row.extend(e.kv_write)
        ids = [self.future[e.row]] if e.input_from_future else e.input_ids
        for j, token in enumerate(ids):
            self.slot_token[row[e.prefix_len + j]] = token
        return [self.slot_token[row[p]] for p in range(e.seq_len)]

    def _verify(self, seq: list[int], prefix_len: int, drafts: list[int]) -> list[int]:
        """Greedy acceptance: the drafts the model would have produced itself."""
        kept: list[int] = []
        for j, draft in enumerate(drafts):
            if self.model(seq[: prefix_len + 1 + j]) != draft:
                break
            kept.append(draft)
        return kept

    def close(self) -> None:
        pass


def make_fake(tokens: int = 1024, rows: int = 16, model: Model = hash_model,
              grammars: GrammarQueue | None = None, **overrides: Any) -> tuple[Scheduler, FakeIO, FakeRunner]:
    """A scheduler over a FakeRunner with a pool of `tokens` KV slots (plus the padding page)."""
    cfg: dict[str, Any] = dict(context_length=512, chunked_prefill_size=-1, enable_mixed_chunk=False,
                               disable_overlap_schedule=True, max_running_requests=rows)
    cfg.update(overrides)
    config = ServerConfig(**cfg)
    runner = FakeRunner(tokens + config.page_size, rows, model)
    io = FakeIO()

    def decode(ids: list[int], skip_special_tokens: bool) -> str:
        return " ".join(map(str, ids))

    sched = Scheduler(config, runner, decode, frozenset({EOS}), io, grammars)
    return sched, io, runner
