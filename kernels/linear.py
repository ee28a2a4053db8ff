"""A linear layer whose weight is prepacked for the device once, after loading, and whose product
is computed by a swappable method object: full precision by default, weight-only int8 when
`load_model` chooses it.

On CPU the weight is reordered once into oneDNN's blocked layout and every call runs
`mkldnn._linear_pointwise`: about 2x faster than `F.linear` in fp32 (which goes through MKL, slow
on AMD) and 1.3-1.8x in bf16, for every batch size. Elsewhere, or when packing fails, `F.linear`.

Weight-only int8 (`Int8LinearMethod`, installed by `Linear.quantize_int8()` before `pack()`): a
per-output-channel int8 copy of the weight, used for calls of at most INT8_MAX_ROWS rows through
torch's `_weight_int8pack_mm` with bf16 activations. A decode step at small batch only streams
the weights, so half the bytes of bf16 (a quarter of fp32) is what makes it faster; beyond a few
rows that kernel loses to the packed one, which then runs instead (so the full-precision packed
copy is kept too).

Plain rows with our GEMV (`RowGemvLinearMethod`, installed by `load_model` on CPU in fp32 when our
kernels are built): the weight stays as loaded, row-major, and is never packed. Calls of at most
GEMV_MAX_ROWS rows (decode) run our kernel (kernels/csrc/dense_gemv.cpp), which streams one row
at about 1.6-1.9x the bandwidth of oneDNN's packed fp32 call; larger calls (prefill) run oneDNN
on the plain weight, slower than on a packed one (docs/benchmarks.md). Batched decode of 5-16
rows is what this trades away (0.77-0.82x the packed speed); a tied head needs no copy of the
embedding table, which the packed one did.

The method is an object beside the layer, not a subclass of it, because every parallel linear
(runtime/parallel/layers.py: column, row, head) subclasses `Linear` for its sharding and
collective; a quantized subclass per parallel class would multiply the classes.
"""

from __future__ import annotations

from types import ModuleType

import torch
import torch.nn.functional as F
from torch import nn


def pack_weight(weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor | None:
    """The device-specific packed copy of `weight` [out, in], or None to use `F.linear`.

    This is the only place that decides by device: oneDNN packing on CPU. A one-row probe call
    checks that the packed op runs and agrees with `F.linear` (e.g. fp16 on a CPU without it).
    """
    if weight.device.type != "cpu":
        return None
    try:
        packed: torch.Tensor = torch.ops.mkldnn._reorder_linear_weight(weight, None)
        probe = torch.ones((1, weight.shape[1]), dtype=weight.dtype)
        got = packed_linear(probe, packed, bias)
    except (RuntimeError, NotImplementedError):
        return None
    if got.dtype != weight.dtype or not torch.allclose(got, F.linear(probe, weight, bias), rtol=1e-2, atol=1e-2):
        return None
    return packed


def packed_linear(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    y: torch.Tensor = torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")
    return y


INT8_MAX_ROWS = 4  # rows up to which the int8 kernel beats the packed one (measured, both CPUs)


def quantize_int8(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric per-output-channel int8 of `weight` [out, in]: (int8 [out, in], bf16 scales [out]).

    The scales are rounded to bf16 (the kernel's dtype) *before* quantizing, so q * scale is
    exactly what the kernel computes and each weight is off by at most half a step.
    """
    w = weight.float()
    scales = (w.abs().amax(dim=1) / 127).clamp_(min=1e-12).to(torch.bfloat16)
    q = torch.round(w / scales.float()[:, None]).clamp_(-127, 127).to(torch.int8)
    return q, scales


def _int8_linear(x: torch.Tensor, q: torch.Tensor, scales: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    y = torch.ops.aten._weight_int8pack_mm(x.to(torch.bfloat16).contiguous(), q, scales).to(x.dtype)
    return y if bias is None else y + bias


class LinearMethod:
    """How a `Linear` computes x @ weight.T + bias: in full precision, through the packed weight
    when `pack()` made one, else `F.linear`. Stateless: every layer shares `DENSE`."""

    full_precision = True  # False: the product carries the weight quantization's error
    packs = True  # False: `Linear.pack()` leaves the plain weight as it is (the method reads it)

    def apply(self, layer: Linear, x: torch.Tensor) -> torch.Tensor:
        if layer.packed is not None:
            return packed_linear(x, layer.packed, layer.bias)
        assert layer.weight is not None, "a layer without a packed weight keeps its plain one"
        return F.linear(x, layer.weight, layer.bias)


DENSE = LinearMethod()


class Int8LinearMethod(LinearMethod):
    """Weight-only int8 for calls of at most INT8_MAX_ROWS rows; full precision above that.

    Holds the int8 copy of one layer's weight (quantized from the loaded weight at construction).
    """

    def __init__(self, weight: torch.Tensor) -> None:
        self.q_weight, self.q_scales = quantize_int8(weight)

    def apply(self, layer: Linear, x: torch.Tensor) -> torch.Tensor:
        if x.shape[0] <= INT8_MAX_ROWS:
            return _int8_linear(x, self.q_weight, self.q_scales, layer.bias)
        return super().apply(layer, x)


# Rows up to which our GEMV runs (its most): at 1-4 rows 1.0-2.0x oneDNN's packed fp32 speed,
# at 5-16 0.77-0.82x, and faster than oneDNN on the plain weight throughout (docs/benchmarks.md).
GEMV_MAX_ROWS = 16


class RowGemvLinearMethod(LinearMethod):
    """fp32 on CPU from the plain weight: our GEMV for calls of at most GEMV_MAX_ROWS rows,
    oneDNN on the same (unpacked) weight above that. `kernels`: our built CPU kernels."""

    packs = False

    def __init__(self, kernels: ModuleType) -> None:
        self.kernels = kernels

    def apply(self, layer: Linear, x: torch.Tensor) -> torch.Tensor:
        assert layer.weight is not None, "the plain weight is what this method reads"
        rows = x.reshape(-1, layer.in_features)
        if rows.shape[0] <= GEMV_MAX_ROWS:
            y: torch.Tensor = self.kernels.dense_gemv(rows, layer.weight, layer.bias)
        else:
            y = packed_linear(rows.contiguous(), layer.weight, layer.bias)  # oneDNN takes a plain weight too
        return y.reshape(*x.shape[:-1], y.shape[-1])


class Linear(nn.Module):
    """y = x @ weight.T + bias, with `weight` [out, in]. Call `pack()` once after loading.

    After a successful pack the plain `weight` is dropped (set to None) so the layer holds one copy;
    a tied lm_head packs its own copy and leaves the shared embedding weight alone.
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool = False,
        dtype: torch.dtype | None = None,
        device: torch.device | None = None,
    ) -> None:
        super().__init__()
        self.in_features = in_features
        self.out_features = out_features
        weight = torch.empty((out_features, in_features), dtype=dtype, device=device)
        self.weight: nn.Parameter | None = nn.Parameter(weight, requires_grad=False)
        self.bias: nn.Parameter | None = None
        if bias:
            self.bias = nn.Parameter(torch.empty(out_features, dtype=dtype, device=device), requires_grad=False)
        self.packed: torch.Tensor | None = None
        self.method: LinearMethod = DENSE

    def quantize_int8(self) -> None:
        """Swap in the int8 method for small calls. Must run before `pack()` drops the weight."""
        assert self.weight is not None, "quantize_int8() must run before pack()"
        self.method = Int8LinearMethod(self.weight.detach())

    @property
    def q_weight(self) -> torch.Tensor | None:
        """The int8 weight [out, in] when the int8 method is installed."""
        return self.method.q_weight if isinstance(self.method, Int8LinearMethod) else None

    @property
    def q_scales(self) -> torch.Tensor | None:
        """The bf16 per-row scales [out] when the int8 method is installed."""
        return self.method.q_scales if isinstance(self.method, Int8LinearMethod) else None

    def pack(self) -> None:
        """Prepack the loaded weight for its device (no-op when already packed or unsupported)."""
        if self.packed is not None or self.weight is None or not self.method.packs:
            return  # no weight: the method holds it (blocks); or the method reads the plain one
        self.packed = pack_weight(self.weight.detach(), self.bias)
        if self.packed is not None:
            self.weight = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.method.apply(self, x)

    def extra_repr(self) -> str:
        return (f"in={self.in_features}, out={self.out_features}, bias={self.bias is not None}, "
                f"packed={self.packed is not None}, method={type(self.method).__name__}")
