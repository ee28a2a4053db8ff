"""What one forward step returns to the scheduler."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kernels.transfer import PendingHost

TopLogprobs = list[tuple[list[int], list[float]]]  # per position: (token ids, log-probs)


@dataclass
class ForwardResult:
    next_ids: torch.Tensor  # int64 [B], on the device
    logprobs: torch.Tensor | None  # fp32 [B], log-prob of each sampled token, when asked for
    top_logprobs: TopLogprobs | None
    input_logprobs: list[list[float] | None]
    input_top_logprobs: list[TopLogprobs | None]
    last_logits: torch.Tensor | None = None  # fp32 [B, vocab], only when asked for
    # Speculative entries: the drafts each accepted (next_ids[i] is the token after them).
    accepted: list[list[int]] | None = None
    # next_ids (and logprobs) on their way to the host: reading them is the step's one sync.
    pending: PendingHost | None = None
    # Per entry: the last row's final hidden state (fp32, on the host) for embed entries, else None;
    # None when no entry asked.
    embeddings: list[list[float] | None] | None = None

    def host_next_ids(self) -> list[int]:
        return self._host()[0]

    def host_logprobs(self) -> list[float] | None:
        return self._host()[1] if self.logprobs is not None else None

    def start_host_copy(self) -> None:
        """Queue the host copy of next_ids (and logprobs); again after they are replaced."""
        self.pending = PendingHost([t for t in (self.next_ids, self.logprobs) if t is not None])

    def _host(self) -> list[list]:
        if self.pending is None:
            self.start_host_copy()
        assert self.pending is not None
        return self.pending.wait()
