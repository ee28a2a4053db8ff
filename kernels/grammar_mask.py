"""Grammar masks on logits: token bitmasks in xgrammar's layout, applied in place.

Layout (xgrammar's): an int32 bitmask `[R, ceil(V / 32)]`; bit j (LSB = bit 0) of word w of a row
allows token `32 * w + j`. A set bit allows the token, a clear bit sends its logit to -inf, so an
all-ones row (-1 words) allows everything.

Row r of the bitmask masks row r of the logits (xgrammar's `indices` semantics), so the scheduler
fills bitmask rows at the batch positions of its constrained requests and passes those positions;
the other rows are never read or written.

On CPU this uses xgrammar's C++ kernel when xgrammar imports (several times faster than the torch
version at these sizes, see scripts/bench_grammar.py); elsewhere, or without xgrammar, the
vectorized torch version. This module imports no xgrammar at import time.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

_BITS = 32
_xgr_kernel: Callable[..., None] | None | bool = False  # False: not looked up yet


def bitmask_words(vocab_size: int) -> int:
    """Words per bitmask row: ceil(vocab_size / 32)."""
    return (vocab_size + _BITS - 1) // _BITS


def apply_token_bitmask(
    logits: torch.Tensor, bitmask: torch.Tensor, rows: Sequence[int] | torch.Tensor
) -> None:
    """Set the disallowed logits of `rows` to -inf, in place.

    Args:
        logits: float [B, V], on the bitmask's device.
        bitmask: int32 [R, W], R > max(rows). Tokens past 32 * W (a logits row wider than the
            bitmask) are disallowed; words past V are ignored.
        rows: distinct row indices into both tensors.
    """
    rows = rows.tolist() if isinstance(rows, torch.Tensor) else list(rows)
    if not rows:
        return
    assert bitmask.dtype == torch.int32, f"bitmask must be int32, got {bitmask.dtype}"
    assert logits.dim() == 2 and bitmask.dim() == 2, "logits [B, V] and bitmask [R, W]"
    kernel = _xgrammar_cpu_kernel() if logits.device.type == "cpu" else None
    if kernel is not None and logits.dtype in (torch.float32, torch.bfloat16, torch.float16):
        covered = min(logits.shape[1], bitmask.shape[1] * _BITS)
        kernel(logits, bitmask, covered, rows)
    else:
        apply_token_bitmask_torch(logits, bitmask, rows)
    _block_uncovered(logits, bitmask, rows)


def apply_token_bitmask_torch(
    logits: torch.Tensor, bitmask: torch.Tensor, rows: Sequence[int]
) -> None:
    """The torch version of `apply_token_bitmask` for the covered columns (any device)."""
    assert logits.device == bitmask.device, "logits and bitmask must be on one device"
    vocab = min(logits.shape[1], bitmask.shape[1] * _BITS)
    words = bitmask_words(vocab)
    index = torch.tensor(rows, dtype=torch.long, device=logits.device)
    bits = torch.tensor([1 << i for i in range(_BITS - 1)] + [-(1 << 31)], dtype=torch.int32,
                        device=bitmask.device)
    # [n, W, 32] -> [n, 32 W]: column 32 w + j tests bit j of word w (LSB first).
    allowed = (bitmask[index, :words].unsqueeze(-1) & bits) != 0
    blocked = ~allowed.view(len(rows), words * _BITS)[:, :vocab]
    if len(rows) == logits.shape[0] and rows == list(range(len(rows))):
        logits[:, :vocab].masked_fill_(blocked, float("-inf"))
        return
    # NOTE: per-row masked_fill_ on views writes in place; logits[index] would copy the rows out
    # and back (two extra passes over [n, V]).
    for i, r in enumerate(rows):
        logits[r, :vocab].masked_fill_(blocked[i], float("-inf"))


def _block_uncovered(logits: torch.Tensor, bitmask: torch.Tensor, rows: list[int]) -> None:
    """Tokens the bitmask does not cover are never grammatical: -inf."""
    covered = bitmask.shape[1] * _BITS
    if logits.shape[1] > covered:
        logits[rows, covered:] = float("-inf")


def _xgrammar_cpu_kernel() -> Callable[..., None] | None:
    """xgrammar's CPU kernel as `f(logits, bitmask, vocab_size, rows)`, or None without it."""
    global _xgr_kernel
    if _xgr_kernel is False:
        try:
            from xgrammar.kernels.apply_token_bitmask_inplace_cpu import (
                apply_token_bitmask_inplace_cpu,
            )

            _xgr_kernel = apply_token_bitmask_inplace_cpu
        except ImportError:
            _xgr_kernel = None
    return _xgr_kernel  # type: ignore[return-value]
