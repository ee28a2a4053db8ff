"""A prompt's requests to the scheduler: one, or with n > 1 a prefill-only warm-up copy and n
children (SGLang's parallel sampling). Pure: no sockets, no tokenizer.

    rid "r", n=1  ->  "r"
    rid "r", n=3  ->  "r_warmup" (prefill only, caches the prompt), then "r_0", "r_1", "r_2"

A seeded prompt gives its samples seeds seed + j, so they differ. Aborting "r" aborts them all:
every derived rid is "r" + "_" + a suffix the scheduler's abort matching knows.
"""

from __future__ import annotations

import dataclasses

from runtime.messages import GenerateReq
from tokenizer.generate_body import SingleRequest

WARMUP_SUFFIX = "_warmup"  # NOTE: "_"-separated, so aborting the parent rid aborts it too
SEED_LIMIT = 1 << 63  # SamplingParams.seed is in [0, 2**63)


@dataclasses.dataclass(slots=True)
class Prepared:
    """One validated prompt: its GenerateReq (n children copy it) and its fan-out."""

    req: GenerateReq
    single: SingleRequest
    n: int

    def child_rids(self) -> list[str]:
        return [self.req.rid] if self.n == 1 else [f"{self.req.rid}_{j}" for j in range(self.n)]

    def all_rids(self) -> list[str]:
        """Every rid it sends, the warm-up's first."""
        warm = [self.req.rid + WARMUP_SUFFIX] if self.n > 1 else []
        return warm + self.child_rids()

    def child_req(self, j: int, rid: str) -> GenerateReq:
        """Sample j of the prompt."""
        params = self.req.sampling_params
        if params.seed is not None and j > 0:
            params = dataclasses.replace(params, seed=(params.seed + j) % SEED_LIMIT)
        return dataclasses.replace(self.req, rid=rid, sampling_params=params)

    def warmup_req(self) -> GenerateReq:
        """A prefill-only copy of the prompt, so the n children share its cached prefix."""
        params = dataclasses.replace(self.req.sampling_params, max_new_tokens=0, min_new_tokens=0)
        return dataclasses.replace(self.req, rid=self.req.rid + WARMUP_SUFFIX, sampling_params=params,
                                   return_logprob=False, stream=False, prefill_only_cache=True)
