"""How the model runner takes part in tensor parallelism: a step hook it calls around each
forward, so the runner itself has no tensor-parallel branches.

- `SingleRank`: no group; every call is free.
- `StepLeader` (rank 0): sends the step's entries to the other ranks before the forward, then
  broadcasts its sampled ids, so every rank's future map holds rank 0's choices.
- `StepFollower` (ranks 1..): runs the steps `tp_worker.follow_steps` receives; takes rank 0's ids.

The entries travel as JSON lists (`entry_to_wire`), never pickle, over the group's private channel.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import TYPE_CHECKING, Any, Protocol

from runtime.contracts.messages import TPStep, TPStop
from runtime.contracts.sampling import SamplingParams
from runtime.execution.forward_batch import ForwardEntry

if TYPE_CHECKING:
    import torch

    from runtime.parallel.group import TPGroup

logger = logging.getLogger("radixserve.tp")

# A ForwardEntry on the wire: its fields in declaration order, JSON types only.
_ENTRY_FIELDS = tuple(f.name for f in dataclasses.fields(ForwardEntry))
_SAMPLING = _ENTRY_FIELDS.index("sampling")
_BITMASK = _ENTRY_FIELDS.index("token_bitmask")


class StepHook(Protocol):
    def before_forward(self, entries: list[ForwardEntry], keep_logits: bool) -> None: ...

    def agree_on(self, next_ids: torch.Tensor) -> None:
        """Make every rank hold the same sampled ids (rank 0's), in place."""

    def close(self) -> None: ...


class SingleRank:
    """No tensor parallelism."""

    def before_forward(self, entries: list[ForwardEntry], keep_logits: bool) -> None:
        pass

    def agree_on(self, next_ids: torch.Tensor) -> None:
        pass

    def close(self) -> None:
        pass


class StepFollower:
    """Ranks 1..: the steps come from rank 0 (`tp_worker.follow_steps`); ids are rank 0's."""

    def __init__(self, group: TPGroup) -> None:
        self.group = group

    def before_forward(self, entries: list[ForwardEntry], keep_logits: bool) -> None:
        pass

    def agree_on(self, next_ids: torch.Tensor) -> None:
        self.group.broadcast_(next_ids)

    def close(self) -> None:
        pass


class StepLeader:
    """Rank 0: each forward's description goes to the other ranks before it runs, and every
    rank then takes rank 0's sampled ids."""

    def __init__(self, group: TPGroup) -> None:
        self.group = group

    def before_forward(self, entries: list[ForwardEntry], keep_logits: bool) -> None:
        self.group.broadcast_message(TPStep([entry_to_wire(e) for e in entries], keep_logits))

    def agree_on(self, next_ids: torch.Tensor) -> None:
        self.group.broadcast_(next_ids)

    def close(self) -> None:
        """Release the followers (they exit) and leave the group. A follower stuck or gone (the
        launcher reported its death, which is why the scheduler stops) is only logged."""
        try:
            self.group.broadcast_message(TPStop())
        except ConnectionError as exc:
            logger.warning("a tensor-parallel rank was gone at shutdown: %s", exc)
        self.group.close()


def entry_to_wire(entry: ForwardEntry) -> list[Any]:
    """`entry` as JSON types: its fields in order, sampling as a dict, the bitmask as ints."""
    wire = [getattr(entry, name) for name in _ENTRY_FIELDS]
    wire[_SAMPLING] = entry.sampling.to_dict()
    if entry.token_bitmask is not None:
        wire[_BITMASK] = entry.token_bitmask.tolist()
    return wire


def entry_from_wire(wire: list[Any]) -> ForwardEntry:
    """The ForwardEntry `entry_to_wire` described."""
    import torch  # here, not at the top: the launcher imports this module for its entry point

    if len(wire) != len(_ENTRY_FIELDS):
        raise ValueError(f"a ForwardEntry has {len(_ENTRY_FIELDS)} fields, the wire list {len(wire)}")
    values = list(wire)
    values[_SAMPLING] = _sampling_from_wire(values[_SAMPLING])
    if values[_BITMASK] is not None:
        values[_BITMASK] = torch.tensor(values[_BITMASK], dtype=torch.int32)
    return ForwardEntry(*values)


def _sampling_from_wire(d: dict[str, Any]) -> SamplingParams:
    """`SamplingParams.to_dict`'s output back, without `from_dict`'s checks: rank 0 checked these
    params when the request came in, and at ~17 us each they would cost a batch of 16 more than
    the rest of the step's encoding."""
    params = SamplingParams(**d)
    if params.logit_bias is not None:  # JSON made the token ids strings
        params.logit_bias = {int(k): float(v) for k, v in params.logit_bias.items()}
    return params
