"""One decoder layer's decode step in one call (kernels/csrc/decode_layer.cpp) against its float64
composition (tests/kernels/csrc/layer_reference.py): weights quantized and decoded by gguf, a
q8_0, q4_0 and q4_1 linear among the four, a qkv bias, GQA (2 query heads per KV head), rows
of uneven lengths; the output, the residual stream and the KV write.

Two references:
  - with each linear's input rounded to 8-bit blocks as the kernel rounds it: then only fp32
    rounding separates the two, except where that rounding moves an input across a block
    rounding boundary (a flip). fp32's share is below 1e-5 of each result's norm. A flip needs an
    input within about 1e-6 * 127 steps of a half step (probability near 2.5e-4 per value, some
    1500 values rounded: 0.4 flips expected) and moves one linear's output by one step times a
    weight column, at most about 1/(127 sqrt(K / 32)) < 0.5% of the row's norm here; 1% of the
    norm allows several flips, where a fault in the composition (a head, a slice, the residual)
    moves a result by tens of percent;
  - with the inputs unrounded: each block rounding moves an input x by at most sqrt(32) / 254 of
    |x| (half a step of max|x_b| / 127 per value, max|x_b| <= |x_b|), and a random weight passes
    that relative error on; the layer's output meets four such inputs, q and k twice in the
    scores and gate and up twice in their product: 8 of them bound it.
"""

from __future__ import annotations

import math
from types import ModuleType

import numpy as np
import pytest
import torch

from kernels import gguf_blocks as gb
from kernels.quant_linear import ISA_CODES
from runtime.execution.device import cpu_capability
from tests.kernels.csrc.block_reference import gguf_blocks, gguf_weight
from tests.kernels.csrc.layer_reference import NAMES, LayerWeights, decode_step, rotary_table

HIDDEN, HEADS, KV_HEADS, HEAD_DIM, INTER = 96, 4, 2, 64, 64
FORMATS = {"qkv": "q8_0", "o": "q4_0", "gate_up": "q4_1", "down": "q4_0"}
PRIOR = [4, 17, 33]  # each row's cached tokens before this step
MODELLED_TOL = 1e-2
UNROUNDED_TOL = 8 * math.sqrt(32) / 254


def _shapes() -> dict[str, tuple[int, int]]:
    qkv = (HEADS + 2 * KV_HEADS) * HEAD_DIM
    return {"qkv": (qkv, HIDDEN), "o": (HIDDEN, HEADS * HEAD_DIM), "gate_up": (2 * INTER, HIDDEN),
            "down": (HIDDEN, INTER)}


def _relative(got: torch.Tensor, want: np.ndarray) -> float:
    return float(np.linalg.norm(got.double().numpy() - want) / np.linalg.norm(want))


@pytest.mark.parametrize("with_residual", [False, True])
def test_layer_matches_its_float64_composition(kernels: ModuleType, with_residual: bool) -> None:
    rng = np.random.default_rng(11 + with_residual)
    blocks = {name: gguf_blocks(rng.standard_normal(shape) / math.sqrt(shape[1]), FORMATS[name])
              for name, shape in _shapes().items()}
    norms = [torch.from_numpy(rng.uniform(0.5, 1.5, HIDDEN).astype(np.float32)) for _ in range(2)]
    qkv_bias = torch.from_numpy((0.1 * rng.standard_normal(_shapes()["qkv"][0])).astype(np.float32))
    weights = LayerWeights((norms[0].double().numpy(), norms[1].double().numpy()),
                           {name: gguf_weight(b, FORMATS[name]) for name, b in blocks.items()},
                           qkv_bias.double().numpy(), HEADS, KV_HEADS, HEAD_DIM, 1e-6)

    pool_slots = sum(PRIOR) + 20
    order = (rng.permutation(pool_slots - 1) + 1).tolist()  # slot 0 unused
    out_loc = order[: len(PRIOR)]
    rows = [order[len(PRIOR) + sum(PRIOR[:b]) :][:n] + [out_loc[b]] for b, n in enumerate(PRIOR)]
    k_pool, v_pool = (torch.from_numpy(rng.standard_normal((pool_slots, KV_HEADS, HEAD_DIM)).astype(np.float32))
                      for _ in range(2))
    h = torch.from_numpy(rng.standard_normal((len(PRIOR), HIDDEN)).astype(np.float32))
    residual = torch.from_numpy(rng.standard_normal((len(PRIOR), HIDDEN)).astype(np.float32)) if with_residual else None
    table = rotary_table(torch.tensor(PRIOR), HEAD_DIM, torch.float32)

    isa = "avx512" if cpu_capability().block_kernel_isa == "avx512" else "avx2"
    k_after, v_after = k_pool.clone(), v_pool.clone()
    out, stream = kernels.decode_layer(
        h, residual, norms, weights.eps, [gb.interleave_rows(blocks[n], gb.FORMATS[FORMATS[n]]) for n in NAMES],
        [gb.FORMATS[FORMATS[n]].code for n in NAMES], [_shapes()[n][0] for n in NAMES],
        [qkv_bias, torch.empty(0), torch.empty(0), torch.empty(0)], ISA_CODES[isa], table, HEADS, k_after, v_after,
        torch.tensor(out_loc), torch.tensor([s for r in rows for s in r]), torch.tensor([0, *np.cumsum(
            [len(r) for r in rows]).tolist()]), HEAD_DIM**-0.5)

    untouched = torch.ones(pool_slots, dtype=torch.bool)
    untouched[out_loc] = False
    assert torch.equal(k_after[untouched], k_pool[untouched]) and torch.equal(v_after[untouched], v_pool[untouched])
    args = (weights, h.double().numpy(), None if residual is None else residual.double().numpy(),
            table.double().numpy(), k_pool.double().numpy(), v_pool.double().numpy(), out_loc, rows)
    for quantized, tol in ((True, MODELLED_TOL), (False, UNROUNDED_TOL)):
        want_out, want_stream, want_k, want_v = decode_step(*args, quantized=quantized)
        errors = {"out": _relative(out, want_out), "residual stream": _relative(stream, want_stream),
                  "K written": _relative(k_after[out_loc], want_k[out_loc]),
                  "V written": _relative(v_after[out_loc], want_v[out_loc])}
        worst = max(errors, key=errors.__getitem__)
        assert errors[worst] <= tol, f"{'modelled' if quantized else 'unrounded'} activations: {errors}"
