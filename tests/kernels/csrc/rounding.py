"""Unit roundoffs and error factors for the bounds the kernel tests hold results to.

A bound here is a worst case of the arithmetic, not a measurement: a sum of n terms in fp32, in
any order and with or without fused multiply-adds, is within gamma(n) * (sum of |terms|) of the
exact sum (Higham, Accuracy and Stability of Numerical Algorithms, 3.1). So a bound holds on
every CPU and vector width the kernels run on (AVX2, AVX-512, AMX machines, qemu), and a planted
fault, which moves a result by a whole term or more, lands far outside it.
"""

from __future__ import annotations

import torch

U32 = 2.0**-24  # fp32: |fl(x) - x| <= U32 * |x| (round to nearest)
UBF16 = 2.0**-8  # bf16 (8 significant bits)
# -ffast-math lets libmvec's vector exp and log stand in for the scalar ones (glibc documents
# them within 4 ulp) and computes 1 / x and 1 / sqrt(x) from the approximate rcp / rsqrt
# instructions with one Newton step (GCC's documented -ffast-math code, within a few ulp). Each
# such operation is counted as FAST_ULPS ulp of its result.
FAST_ULPS = 8


def gamma(n: int | torch.Tensor, u: float = U32) -> float | torch.Tensor:
    """Higham's gamma_n = n u / (1 - n u): the relative bound of n successive roundings."""
    return n * u / (1 - n * u)


def assert_within(got: torch.Tensor, want: torch.Tensor, bound: torch.Tensor, what: str) -> None:
    """|got - want| <= bound elementwise (float64), with the worst offender in the message."""
    err = (got.double() - want).abs()
    excess = err - bound
    worst = tuple(int(i) for i in torch.unravel_index(excess.argmax(), excess.shape))
    assert bool((excess <= 0).all()), (f"{what}: error {err[worst].item():.3g} over the bound "
                                       f"{bound[worst].item():.3g} at {worst}")
