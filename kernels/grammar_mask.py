"""Grammar masks on logits: token bitmasks in xgrammar's layout, applied in place.

Layout (xgrammar's): an int32 bitmask `[R, ceil(V / 32)]`; bit j (LSB = bit 0) of word w of a row
allows token `32 * w + j`. A set bit allows the token, a clear bit sends its logit to -inf, so an
all-ones row (-1 words) allows everything.

Row r of the bitmask masks row r of the logits (xgrammar's `indices` semantics), so the scheduler
fills bitmask rows at the batch positions of its constrained requests and passes those positions;
the other rows are never read or written.

Grammar masks come in two shapes, and on CPU each has its own fastest path (measured on
[16, 49152] fp32 logits, one thread; see scripts/bench_grammar.py):
  - sparse rows, where few words allow anything (JSON structure, keys, enums, numbers):
    fill the row with -inf and write back the few allowed words. xgrammar's CPU kernel tests
    every token and takes ~4.7 ms for 16 such rows; this ~0.8 ms.
  - dense rows (free text inside a string: nearly everything allowed): xgrammar's C++ kernel,
    which skips all-ones words (~0.3 ms for 16 rows), when xgrammar imports; else torch.
On the real mix of a JSON answer (about half the rows sparse), 16 rows take ~1.6 ms against
3.4-3.6 ms for xgrammar's kernel alone and 2.1-3.3 ms for the plain torch version.
Elsewhere (CUDA: xgrammar's GPU kernel needs triton), or when the logits are not exactly
32 * words wide, the vectorized torch version. This module imports no xgrammar at import time.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from kernels.transfer import upload, upload_tensor

_BITS = 32
_NEG_INF = float("-inf")
SPARSE_FRACTION = 4  # a row is sparse when under 1/4 of its words allow any token
_xgr_kernel: Callable[..., None] | None | bool = False  # False: not looked up yet


def bitmask_words(vocab_size: int) -> int:
    """Words per bitmask row: ceil(vocab_size / 32)."""
    return (vocab_size + _BITS - 1) // _BITS


def apply_row_bitmasks(logits: torch.Tensor, row_masks: Sequence[torch.Tensor | None]) -> None:
    """Mask row i of `logits` [B, V] in place with `row_masks[i]` (an int32 [words] host bitmask,
    or None for an unconstrained row): the rows' masks go up in one copy."""
    rows = [i for i, mask in enumerate(row_masks) if mask is not None]
    if not rows:
        return
    first = row_masks[rows[0]]
    assert first is not None
    bitmask = torch.full((len(row_masks), first.shape[0]), -1, dtype=torch.int32)
    for i in rows:
        bitmask[i] = row_masks[i]  # type: ignore[assignment]  # rows holds the non-None ones
    if logits.device.type != "cpu":
        # Every row at once (the unconstrained ones are all ones): one masked fill, and no row
        # index to upload.
        rows = list(range(len(row_masks)))
    apply_token_bitmask(logits, upload_tensor(bitmask, logits.device), rows)


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
    assert logits.device == bitmask.device, "logits and bitmask must be on one device"
    exact = logits.shape[1] == bitmask.shape[1] * _BITS and logits.is_contiguous()
    if logits.device.type == "cpu" and exact:
        sparse, dense = _split_sparse(bitmask, rows)
        if sparse:
            _apply_sparse(logits, bitmask, sparse)
        if dense:
            _apply_dense_cpu(logits, bitmask, dense)
        return
    apply_token_bitmask_torch(logits, bitmask, rows)
    covered = bitmask.shape[1] * _BITS
    if logits.shape[1] > covered:  # tokens the bitmask does not cover are never grammatical
        logits[rows, covered:] = _NEG_INF


def apply_token_bitmask_torch(
    logits: torch.Tensor, bitmask: torch.Tensor, rows: Sequence[int]
) -> None:
    """Mask the columns the bitmask covers, one vectorized pass (any device)."""
    vocab = min(logits.shape[1], bitmask.shape[1] * _BITS)
    words = bitmask_words(vocab)
    every_row = len(rows) == logits.shape[0] == bitmask.shape[0] and list(rows) == list(range(len(rows)))
    # Every row in order: no index (on a GPU, building one from a list would be a blocking copy).
    selected = bitmask[:, :words] if every_row else bitmask[upload(rows, torch.long, bitmask.device), :words]
    # [n, W, 32] -> [n, 32 W]: column 32 w + j tests bit j of word w (LSB first).
    blocked = (selected.unsqueeze(-1) & _bit_values(bitmask.device)) == 0
    blocked = blocked.view(len(rows), words * _BITS)[:, :vocab]
    if every_row:
        logits[:, :vocab].masked_fill_(blocked, _NEG_INF)
        return
    # NOTE: per-row masked_fill_ on views writes in place; logits[index] would copy the rows out
    # and back (two extra passes over [n, V]).
    for i, r in enumerate(rows):
        logits[r, :vocab].masked_fill_(blocked[i], _NEG_INF)


def _split_sparse(bitmask: torch.Tensor, rows: list[int]) -> tuple[list[int], list[int]]:
    """(sparse rows, dense rows): sparse when few words allow any token."""
    index = torch.tensor(rows, dtype=torch.long)
    live_words = (bitmask[index] != 0).sum(dim=-1).tolist()
    limit = bitmask.shape[1] // SPARSE_FRACTION
    sparse = [r for r, live in zip(rows, live_words) if live < limit]
    dense = [r for r, live in zip(rows, live_words) if live >= limit]
    return sparse, dense


def _apply_sparse(logits: torch.Tensor, bitmask: torch.Tensor, rows: list[int]) -> None:
    """Keep the words that allow something, fill the rows with -inf, write those words back
    masked. Needs logits exactly 32 * W wide and contiguous (viewed as [B, W, 32])."""
    index = torch.tensor(rows, dtype=torch.long)
    masks = bitmask[index]
    pos, word = (masks != 0).nonzero(as_tuple=True)
    row = index[pos]
    grid = logits.view(logits.shape[0], bitmask.shape[1], _BITS)
    kept = grid[row, word]  # [k, 32] copies
    kept.masked_fill_((masks[pos, word].unsqueeze(-1) & _bit_values(bitmask.device)) == 0,
                      _NEG_INF)
    for r in rows:
        logits[r].fill_(_NEG_INF)  # a memset per row: far cheaper than a masked pass
    grid[row, word] = kept


def _apply_dense_cpu(logits: torch.Tensor, bitmask: torch.Tensor, rows: list[int]) -> None:
    kernel = _xgrammar_cpu_kernel()
    if kernel is not None and logits.dtype in (torch.float32, torch.bfloat16, torch.float16):
        kernel(logits, bitmask, logits.shape[1], rows)
    else:
        apply_token_bitmask_torch(logits, bitmask, rows)


_bit_cache: dict[torch.device, torch.Tensor] = {}


def _bit_values(device: torch.device) -> torch.Tensor:
    """int32 [32]: 1 << j for each bit j (bit 31 is the sign bit)."""
    bits = _bit_cache.get(device)
    if bits is None:
        values = [1 << j for j in range(_BITS - 1)] + [-(1 << (_BITS - 1))]
        bits = _bit_cache[device] = torch.tensor(values, dtype=torch.int32, device=device)
    return bits


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
