"""N-gram speculative decoding in the scheduler (`--speculative-algorithm ngram`): which running
requests speculate, how many drafts each gets, and the KV bookkeeping of the verify step.

A decode step gives an eligible request up to `--speculative-num-draft-tokens` drafts from its
own tokens (scheduler/ngram.py); its entry computes [last token, *drafts] over its KV in one
forward and the runner verifies them (kernels/spec_verify.py). The scheduler then appends the
accepted drafts and the token after them one by one (stop conditions apply to each) and frees
the KV of the rejected drafts.

Eligible: no grammar (its mask depends on the tokens before), no logprobs, and no sampling that
reads the output so far or the step (penalties, min_new_tokens, logit_bias, a per-request seed);
the others decode as usual in the same batch. Drafts take KV only from what is spare after
every running request's one-token decode (they never cause a retraction), and never more than
the request may still generate.
"""

from __future__ import annotations

from dataclasses import dataclass

from radix.prefix_cache import BasePrefixCache
from runtime.contracts.config import ServerConfig
from scheduler.ngram import NgramIndex
from scheduler.request import Req, needs_history


def slots_to_extend(kv_len: int, n: int, page_size: int) -> int:
    """New slots (whole pages) `alloc_extend` takes for `n` more tokens after `kv_len`."""
    pages = -(-(kv_len + n) // page_size) - -(-kv_len // page_size)
    return pages * page_size


def trim_kv(cache: BasePrefixCache, req: Req, keep: int, page_size: int) -> None:
    """Drop the request's slots past `keep` (rejected drafts); pages it no longer uses at all
    go back to the allocator, a partly used last page stays the request's."""
    extra = req.kv[keep:]
    if not extra:
        return
    del req.kv[keep:]
    last_page = req.kv[-1] // page_size if req.kv else -1
    cache.free([s for s in extra if s // page_size != last_page])


@dataclass
class Speculator:
    num_drafts: int
    min_n: int
    max_n: int
    max_batch: int  # more running requests than this: no drafts
    steps: int = 0  # verify entries run
    proposed: int = 0  # drafts verified
    accepted: int = 0  # drafts accepted

    @classmethod
    def from_config(cls, config: ServerConfig) -> Speculator | None:
        if config.speculative_algorithm == "none":
            return None
        return cls(config.speculative_num_draft_tokens, config.speculative_ngram_min_match_window_size,
                   config.speculative_ngram_max_match_window_size, config.speculative_disable_by_batch_size)

    def active(self, running: int) -> bool:
        return running <= self.max_batch

    def drafts(self, req: Req) -> list[int]:
        """The drafts to verify after `req`'s last token ([] to decode it plainly)."""
        sp = req.sampling
        if (req.grammar is not None or req.return_logprob or needs_history(req) or sp.logit_bias
                or req.remaining_new_tokens < 2):
            return []
        if req.ngram is None:
            req.ngram = NgramIndex(self.min_n, self.max_n)
        return req.ngram.propose(req.fill_ids, min(self.num_drafts, req.remaining_new_tokens - 1))

    def record(self, proposed: int, accepted: int) -> None:
        self.steps += 1
        self.proposed += proposed
        self.accepted += accepted

    @classmethod
    def off(cls) -> Speculator:
        """A speculator that never ran (its state() is all zeros)."""
        return cls(0, 1, 1, 0)

    def state(self) -> dict[str, float]:
        return {"spec_verify_steps": self.steps, "spec_proposed": self.proposed, "spec_accepted": self.accepted,
                "spec_accept_length": self.accept_length}

    @property
    def accept_length(self) -> float:
        """Tokens per verify step (accepted drafts + the one after them), SGLang's accept length."""
        return (self.accepted + self.steps) / self.steps if self.steps else 0.0
