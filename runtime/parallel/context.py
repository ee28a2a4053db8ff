"""What a parallel layer knows of its rank: the shard plan and the collectives that join the ranks.

`runtime.parallel.group.TensorParallel` is the context of a rank of a real group. Without tensor
parallelism the model runs on `SingleRankContext`: the plan of one rank (every range whole) and
collectives that are identities, so the layers and the models take the same path either way.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import torch

from runtime.contracts.model_config import ModelConfig
from runtime.parallel.sharding import ShardPlan


class Collectives(Protocol):
    """The two collectives the layers call (`TPGroup` provides them); every rank calls the same
    ones in the same order."""

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """Sum `x` over the ranks (in place where the transport can)."""
        ...

    def all_gather(self, x: torch.Tensor) -> torch.Tensor:
        """[size, *x.shape]: every rank's `x` (same shape on each), in rank order."""
        ...


class ParallelContext(Protocol):
    """This rank's part of the model (`plan`) and the group it belongs to (`group`)."""

    @property
    def plan(self) -> ShardPlan: ...

    @property
    def group(self) -> Collectives: ...


class NoCollectives:
    """The collectives of a group of one rank: nothing to sum or gather."""

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        return x

    def all_gather(self, x: torch.Tensor) -> torch.Tensor:
        return x.unsqueeze(0)


@dataclass(frozen=True)
class SingleRankContext:
    """The whole model on one rank."""

    plan: ShardPlan
    group: Collectives = field(default_factory=NoCollectives)


def rank_context(tp: ParallelContext | None, config: ModelConfig) -> ParallelContext:
    """`tp`, or the single-rank context of the whole `config` model when there is none."""
    return tp if tp is not None else SingleRankContext(ShardPlan.build(config, 1, 0))
