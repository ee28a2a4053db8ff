"""Load or recompute: the KV tier's one decision, by measured cost.

Loading n tokens from the store costs n * bytes_per_token / copy bandwidth; computing them costs
n / prefill speed. Both rates are measured at start-up (a timed copy, a timed prefill) and kept up
to date from every load and every prefill batch (exponential averages), so a store whose pages
went cold on disk, or a machine busy with decode, moves the choice. Both costs grow with n, so
the choice rarely depends on n: it flips when one rate crosses the other.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

SMOOTHING = 0.25  # weight of each new measurement
MIN_PREFILL_TOKENS = 32  # smaller batches measure the per-step overhead more than prefill speed


@dataclass
class TierCosts:
    bytes_per_token: int
    copy_bytes_per_s: float
    prefill_tokens_per_s: float

    def load_s(self, tokens: int) -> float:
        return tokens * self.bytes_per_token / self.copy_bytes_per_s

    def recompute_s(self, tokens: int) -> float:
        return tokens / self.prefill_tokens_per_s

    def prefer_load(self, tokens: int) -> bool:
        return self.load_s(tokens) <= self.recompute_s(tokens)

    def observe_copy(self, tokens: int, seconds: float) -> None:
        if tokens > 0 and seconds > 0:
            rate = tokens * self.bytes_per_token / seconds
            self.copy_bytes_per_s += SMOOTHING * (rate - self.copy_bytes_per_s)

    def observe_prefill(self, tokens: int, seconds: float) -> None:
        if tokens >= MIN_PREFILL_TOKENS and seconds > 0:
            self.prefill_tokens_per_s += SMOOTHING * (tokens / seconds - self.prefill_tokens_per_s)

    def state(self) -> dict[str, float]:
        return {"tier_copy_gb_per_s": self.copy_bytes_per_s / 1e9,
                "tier_prefill_tokens_per_s": self.prefill_tokens_per_s}


class TierPlan(NamedTuple):
    """What the store offers a prompt past its pool prefix, and whether to load it."""

    found: int  # tokens the store holds there, block by block
    load: bool  # loading them is cheaper than computing them
    missed: bool  # whole blocks lay there and the store had none of them

    @property
    def tokens(self) -> int:
        """Tokens to load (0: compute everything past the pool prefix)."""
        return self.found if self.load else 0


NO_PLAN = TierPlan(0, False, False)
