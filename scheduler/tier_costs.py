"""Load or recompute: the KV tier's one decision, by measured cost.

Loading n tokens from the store costs n * bytes_per_token / copy bandwidth; computing them costs
n / prefill speed. Both rates are measured at start-up (a timed copy, a timed prefill) and kept up
to date from every load and every prefill batch (exponential averages), so a store whose pages
went cold on disk, or a machine busy with decode, moves the choice. Both costs grow with n, so
the choice rarely depends on n: it flips when one rate crosses the other.
"""

from __future__ import annotations

from dataclasses import dataclass

SMOOTHING = 0.25  # weight of each new measurement
MIN_PREFILL_TOKENS = 32  # smaller batches measure the per-step overhead more than prefill speed


@dataclass
class TierCosts:
    bytes_per_token: int
    copy_bytes_per_s: float
    prefill_tokens_per_s: float
    loads_chosen: int = 0
    recomputes_chosen: int = 0

    def load_s(self, tokens: int) -> float:
        return tokens * self.bytes_per_token / self.copy_bytes_per_s

    def recompute_s(self, tokens: int) -> float:
        return tokens / self.prefill_tokens_per_s

    def prefer_load(self, tokens: int) -> bool:
        load = self.load_s(tokens) <= self.recompute_s(tokens)
        if load:
            self.loads_chosen += 1
        else:
            self.recomputes_chosen += 1
        return load

    def observe_copy(self, tokens: int, seconds: float) -> None:
        if tokens > 0 and seconds > 0:
            rate = tokens * self.bytes_per_token / seconds
            self.copy_bytes_per_s += SMOOTHING * (rate - self.copy_bytes_per_s)

    def observe_prefill(self, tokens: int, seconds: float) -> None:
        if tokens >= MIN_PREFILL_TOKENS and seconds > 0:
            self.prefill_tokens_per_s += SMOOTHING * (tokens / seconds - self.prefill_tokens_per_s)

    def state(self) -> dict[str, float | int]:
        return {"tier_copy_gb_per_s": self.copy_bytes_per_s / 1e9,
                "tier_prefill_tokens_per_s": self.prefill_tokens_per_s,
                "tier_loads_chosen": self.loads_chosen, "tier_recomputes_chosen": self.recomputes_chosen}
