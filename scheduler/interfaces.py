"""What the scheduler needs from the model runner and from its sockets, as Protocols.

The scheduler never imports the runner (nor torch) at run time: `runtime.execution.model_runner`
satisfies `Runner` structurally, and tests drive the scheduler with a pure-Python fake
(tests/scheduler/fake_runner.py) in milliseconds.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

from runtime.contracts.messages import BatchTokenOut
from runtime.execution.forward_batch import ForwardEntry

if TYPE_CHECKING:
    from runtime.execution.model_runner import ForwardResult, ModelRunner

# One position's top-k: (token ids, log-probs).
TopK = tuple[Sequence[int], Sequence[float]]


class SchedulerIO(Protocol):
    """The scheduler's sockets (scheduler/process.py) or a test's in-memory stand-in."""

    def recv(self, block: bool) -> list[Any]: ...
    def send_tokens(self, msg: BatchTokenOut) -> None: ...
    def send_control(self, msg: Any) -> None: ...


class RowPool(Protocol):
    """The request-slot table's free rows (`kernels.kv_pool.ReqToTokenPool`)."""

    @property
    def size(self) -> int: ...
    def alloc(self) -> int | None: ...
    def free(self, row: int) -> None: ...
    def available(self) -> int: ...
    def check_integrity(self) -> None: ...


class KVPoolSize(Protocol):
    @property
    def num_slots(self) -> int: ...


class StepResult(Protocol):
    """One forward's outcome (`ForwardResult`), one entry per ForwardEntry."""

    @property
    def top_logprobs(self) -> Sequence[TopK] | None: ...
    @property
    def input_logprobs(self) -> Sequence[Sequence[float] | None]: ...
    @property
    def input_top_logprobs(self) -> Sequence[Sequence[TopK] | None]: ...
    @property
    def accepted(self) -> Sequence[Sequence[int]] | None: ...
    @property
    def embeddings(self) -> Sequence[list[float] | None] | None: ...
    def host_next_ids(self) -> list[int]: ...
    def host_logprobs(self) -> list[float] | None: ...


class Runner(Protocol):
    """The model runner as the scheduler uses it (`ModelRunner`)."""

    @property
    def kv_pool(self) -> KVPoolSize: ...
    @property
    def req_to_token(self) -> RowPool: ...
    @property
    def vocab_size(self) -> int: ...
    @property
    def forward_s(self) -> float: ...
    @property
    def forward_count(self) -> int: ...
    @property
    def engines(self) -> list[dict[str, str]]: ...
    def forward(self, entries: list[ForwardEntry], keep_logits: bool = False) -> StepResult: ...
    def close(self) -> None: ...


if TYPE_CHECKING:  # the real runner must keep fitting these protocols (checked by mypy only)

    def _runner_fits(runner: ModelRunner) -> Runner:
        return runner

    def _result_fits(result: ForwardResult) -> StepResult:
        return result
