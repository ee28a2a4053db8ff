"""Grammar-constrained decoding on the scheduler side: asynchronous xgrammar compilation with a
cache, and one matcher per constrained request.

    backend = GrammarBackend(tokenizer, vocab_size, stop_token_ids=[eos])
    future = backend.submit(spec)                # at arrival; the request waits while not done
    state = backend.new_state(future.result())   # raises InvalidRequest for a bad grammar, and
                                                 # CompileTimeout past COMPILE_TIMEOUT_S
    per step: state.next_mask() for each constrained row (its entry's bitmask), then the model
              runner applies the masks (kernels/grammar_mask.py) and samples;
              after sampling: state.accept(token); finished when state.is_terminated()

Compilation runs in a killable helper process (scheduler/grammar_compile.py): one compile at a
time, each bounded by its own timeout from its start, so a pathological grammar costs only its
own request and at most one core for COMPILE_TIMEOUT_S. A pool thread waits on the helper, so
the scheduler thread never blocks. Everything else (`submit`, `new_state`, `reset`, `forget`,
and every `GrammarState`) belongs to the scheduler thread.

Cache: futures keyed by `GrammarSpec`, the same future for the same spec while it stays cached,
failures included (a bad grammar fails every request that asks for it, without recompiling),
except timeouts, which the grammar queue `forget`s. The cache is an LRU bounded by entry count
(`COMPILE_CACHE_ENTRIES`); xgrammar's own compiler cache is off, so there is exactly one.
`reset()` (flush_cache) empties it; requests already holding a future keep it.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from runtime.support.grammar_check import GrammarSpec
from scheduler.grammar_compile import COMPILE_TIMEOUT_S, GrammarCompileWorker, JsonOptions, compile_spec

if TYPE_CHECKING:  # torch loads on the first bitmask, i.e. only once a grammar is used
    import torch
    from xgrammar import CompiledGrammar, GrammarMatcher

COMPILE_CACHE_ENTRIES = 128
_BITS = 32


def allocate_bitmask(batch: int, vocab_size: int) -> torch.Tensor:
    """An all-allowed int32 token bitmask `[batch, ceil(vocab_size / 32)]` on the CPU (where
    xgrammar fills it; move it to the logits' device before applying)."""
    import torch

    return torch.full((batch, (vocab_size + _BITS - 1) // _BITS), -1, dtype=torch.int32)


class GrammarState:
    """One request's position in its grammar (an xgrammar `GrammarMatcher`)."""

    __slots__ = ("matcher", "vocab_size")

    def __init__(self, matcher: GrammarMatcher, vocab_size: int) -> None:
        self.matcher = matcher
        self.vocab_size = vocab_size

    def accept(self, token_id: int) -> bool:
        """Advance by one sampled token; False (state unchanged) when the grammar forbids it."""
        return bool(self.matcher.accept_token(token_id))

    def fill_mask(self, bitmask: torch.Tensor, row: int) -> bool:
        """Write the allowed next tokens into `bitmask[row]` (CPU, int32).

        Returns:
            False when the row came out all-allowed, so applying it may be skipped.
        """
        return bool(self.matcher.fill_next_token_bitmask(bitmask, row))

    def next_mask(self) -> torch.Tensor | None:
        """The allowed next tokens as one bitmask row (CPU, int32), or None when all are allowed
        (then no mask need be applied)."""
        mask = allocate_bitmask(1, self.vocab_size)
        return mask[0] if self.fill_mask(mask, 0) else None

    def is_terminated(self) -> bool:
        """The grammar is complete and a stop token was accepted."""
        return bool(self.matcher.is_terminated())

    def is_completed(self) -> bool:
        """The output so far is a complete match (a stop token would be accepted now)."""
        return bool(self.matcher.is_completed())

    def allowed_ids(self) -> list[int]:
        """The token ids allowed next, in ascending order (for tests and debugging)."""
        import torch

        mask = allocate_bitmask(1, self.vocab_size)
        self.matcher.fill_next_token_bitmask(mask, 0)
        shifts = torch.arange(_BITS, dtype=torch.int32)
        bits = ((mask[0].unsqueeze(-1) >> shifts) & 1).flatten()[: self.vocab_size]
        ids: list[int] = bits.nonzero().flatten().tolist()
        return ids


class GrammarBackend:
    """Compiles grammars for one tokenizer asynchronously and makes per-request states."""

    def __init__(
        self,
        tokenizer: Any,
        vocab_size: int,
        stop_token_ids: list[int],
        max_workers: int = 1,
        cache_entries: int = COMPILE_CACHE_ENTRIES,
        any_whitespace: bool = True,
        max_whitespace: int | None = None,
        compile_timeout_s: float = COMPILE_TIMEOUT_S,
        compile_fn: Callable[..., Any] = compile_spec,
    ) -> None:
        """
        Args:
            tokenizer: a Hugging Face tokenizer.
            vocab_size: the model's (padded) vocabulary: the logits' width and the bitmask's.
            stop_token_ids: the tokens that end a completed grammar (EOS).
            max_workers: threads waiting on the compile helper (it compiles one at a time).
            any_whitespace: JSON may have any whitespace between tokens (SGLang's default);
                False: compact JSON only (--constrained-json-disable-any-whitespace).
            max_whitespace: at most this many whitespace characters in a row in JSON (stops a
                small model emitting newlines until max_new_tokens); None: unbounded, as in
                SGLang. A bound costs compile time and memory: 32 made the typical schema of
                scripts/bench_grammar.py compile 2x slower and 9x bigger (4.6 MB vs 0.5 MB).
            compile_timeout_s: one compile's limit, from its start in the helper.
            compile_fn: the helper's compile (tests inject a slow one; module-level, picklable).
        """
        import xgrammar as xgr

        info = xgr.TokenizerInfo.from_huggingface(
            tokenizer, vocab_size=vocab_size, stop_token_ids=list(stop_token_ids)
        )
        self.vocab_size = vocab_size
        self.any_whitespace = any_whitespace
        self.max_whitespace = max_whitespace
        self.cache_entries = cache_entries
        self._worker = GrammarCompileWorker(info, compile_timeout_s, compile_fn)
        self._executor = ThreadPoolExecutor(max_workers, thread_name_prefix="grammar")
        self._cache: OrderedDict[GrammarSpec, Future[CompiledGrammar]] = OrderedDict()

    def submit(self, spec: GrammarSpec) -> Future[CompiledGrammar]:
        """The compiled grammar of `spec`, cached or compiling; a bad grammar's future raises
        `InvalidRequest` (param: its field) from `.result()`."""
        future = self._cache.get(spec)
        if future is not None:
            self._cache.move_to_end(spec)
            return future
        future = self._executor.submit(self._compile, spec)
        self._store(spec, future)
        return future

    def forget(self, spec: GrammarSpec) -> None:
        """Drop `spec` from the cache (a compile that timed out is not a verdict on the spec)."""
        self._cache.pop(spec, None)

    def new_state(
        self, compiled: CompiledGrammar, stop_token_ids: list[int] | None = None
    ) -> GrammarState:
        """A fresh matcher at the grammar's start; `stop_token_ids` overrides the backend's."""
        import xgrammar as xgr

        matcher = xgr.GrammarMatcher(compiled, override_stop_tokens=stop_token_ids)
        return GrammarState(matcher, self.vocab_size)

    def reset(self) -> None:
        """Forget every cached grammar (flush_cache). Compiles in flight still complete for the
        requests holding their futures."""
        self._cache.clear()

    def shutdown(self) -> None:
        """Stop the compile threads (pending compiles are cancelled) and the helper."""
        self._executor.shutdown(wait=False, cancel_futures=True)
        self._worker.close()

    def _store(self, spec: GrammarSpec, future: Future[CompiledGrammar]) -> None:
        self._cache[spec] = future
        self._cache.move_to_end(spec)
        while len(self._cache) > self.cache_entries:
            self._cache.popitem(last=False)

    def _compile(self, spec: GrammarSpec) -> CompiledGrammar:
        """Runs on a pool thread (the one thread that talks to the compile helper)."""
        return self._worker.compile(spec, JsonOptions(self.any_whitespace, self.max_whitespace))
