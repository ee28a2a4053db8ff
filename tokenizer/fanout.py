"""A prompt's requests to the scheduler: one, or with n > 1 a prefill-only warm-up copy and n
children (SGLang's parallel sampling). Pure: no sockets, no tokenizer.

Internal rids (what the scheduler and detokenizer key on) derive from the server-made rid of
the prompt's GenerateReq; the client's rid only gives labels (tokenizer/labels.py):

    internal "q7", n=1  ->  "q7"                                   result id: the client's rid "r"
    internal "q7", n=3  ->  "q7_warmup" (prefill only, caches the prompt), then "q7_0", "q7_1",
                            "q7_2"                                 result ids "r_0", "r_1", "r_2"

A seeded prompt gives its samples seeds seed + j, so they differ. Aborting "q7" in the scheduler
aborts them all: every derived rid is "q7" + "_" + a suffix the scheduler's abort matching knows.
"""

from __future__ import annotations

import dataclasses

from runtime.contracts.messages import GenerateReq

WARMUP_SUFFIX = "_warmup"  # NOTE: "_"-separated, so aborting the parent rid aborts it too
SEED_LIMIT = 1 << 63  # SamplingParams.seed is in [0, 2**63)


@dataclasses.dataclass(slots=True)
class Prepared:
    """One validated prompt: its GenerateReq (n children copy it) and its fan-out."""

    req: GenerateReq
    label: str  # the client's rid of the prompt
    group_rid: str | None  # a batch's one rid
    n: int
    text_in_logprobs: bool = False
    owner: str = ""  # who may abort it by name

    def child_rids(self) -> list[str]:
        return [self.req.rid] if self.n == 1 else [f"{self.req.rid}_{j}" for j in range(self.n)]

    def child_labels(self) -> list[str]:
        """The id each child's result reports (the client's rid, suffixed per sample)."""
        rid = self.label
        return [rid] if self.n == 1 else [f"{rid}_{j}" for j in range(self.n)]

    def names(self, label: str) -> tuple[str, ...]:
        """The client names that abort the request labelled `label`: its own, its prompt's and
        its batch's."""
        return tuple(dict.fromkeys(n for n in (label, self.label, self.group_rid) if n is not None))

    def all_names(self) -> list[str]:
        return list(dict.fromkeys(n for label in self.child_labels() for n in self.names(label)))

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
