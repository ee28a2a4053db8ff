"""The one place that chooses, at start-up, which engine runs each compute-bound op on CPU: it
measures the candidates on this CPU at the model's own shapes, logs one line per choice and why,
and /get_server_info shows them (`engines`).

The ops and their candidates:
- block GEMM: the linears on GGUF blocks at many rows (prefill chunks, large batches). Ours
  (kernels/csrc/quant_gemm.cpp: 8-bit activation blocks against the weight blocks in integers,
  AVX-512 VNNI or AVX2), or a library engine on its own copy of the weight
  (kernels/block_engines.py): oneDNN on the blocks dequantized into the activations' dtype (bf16
  runs on the CPU's matrix engine where it has one: AMX tiles on Xeons, AVX-512 BF16 on Zen 4;
  2 bytes a weight), or torch's int4 matmul on the q4 blocks (half a byte a weight).
- prefill attention: ours (kernels/csrc/prefill_attention.cpp) or torch's (K/V gathered, then a
  GEMM, or SDPA's flash kernel).
- the decode cascade: decode rows sharing a long KV prefix attend to it once.
- the expert GEMM of MoE models (kernels/moe.py): each expert's group of rows padded to a tile,
  or not (a group of 1-3 rows then takes the GEMM's faster GEMV path, and rounds differently).

Batch invariance. By default a row's result depends on that row alone, whatever it is batched or
chunked with and whether its prefix came from the cache: each op keeps one engine for every
shape, ours (each is invariant by construction and tested for it), and the cascade is off; what
the alternatives measured is still logged, so a user can see what --enable-batch-variance would
take. With it, the block GEMM switches to the library engine that wins from the smallest measured
row count on (and at every larger one), prefill attention takes the faster engine, and the cascade
is on (this module sets it on the backend):
a row's result then depends on its batch, and greedy tokens may change with it.

Measuring takes a few seconds, so serving measures only with --enable-batch-variance, where it
decides something; `python -m runtime.execution.show_engines` measures either way and prints what each
alternative measured (scripts/bench_peers.sh prints it first).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

import torch

from kernels import block_engines
from kernels.base import ForwardMetadata
from kernels.kv_pool import KVPool
from kernels.linear import Linear
from kernels.moe import ROW_TILE
from kernels.quant_linear import ISA_CODES, BlockQuantLinearMethod
from kernels.sliding_window import PerLayerBackend
from kernels.torch_backend import TorchAttentionBackend
from runtime.contracts.config import ServerConfig
from runtime.execution.device import cpu_capability
from runtime.models.qwen3_moe import SparseMoeBlock

logger = logging.getLogger("radixserve.engines")

ROW_PROBES = (64, 256, 1024)  # rows at which the block GEMM's engines are measured
PREFILL_PROBES = ((256, 0), (128, 1024))  # (new tokens, cached prefix) of one request
MARGIN = 1.1  # an alternative must be this much faster to be taken
UNMEASURED = "batch invariance: one engine for every shape (the alternatives: python -m runtime.execution.show_engines)"
REPEATS = 3  # timed calls per engine and shape, alternating; the fastest counts
ISA_NAMES = {code: name for name, code in ISA_CODES.items()}


@dataclass(frozen=True)
class Choice:
    """One op's engine for one shape, and why."""

    op: str
    shape: str
    engine: str
    why: str

    def line(self) -> str:
        return f"{self.op} {self.shape}: {self.engine} ({self.why})"

    def as_dict(self) -> dict[str, str]:
        return asdict(self)


def choose_engines(model: torch.nn.Module, backend: object, config: ServerConfig, measure: bool | None = None
                   ) -> list[Choice]:
    """Decide and install every op's engine for `model` served by `backend`, measuring the
    alternatives when `measure` (default: with --enable-batch-variance); logs the choices."""
    variance, start = config.enable_batch_variance, time.perf_counter()
    measure = variance if measure is None else measure
    choices = choose_block_gemm(model, variance, measure) + choose_expert_padding(model, variance)
    # A model whose layers differ in window has one backend per window: each takes the same choices.
    inner = list(backend.backends.values()) if isinstance(backend, PerLayerBackend) else [backend]
    torch_backends = [b for b in inner if isinstance(b, TorchAttentionBackend)]
    if torch_backends:
        first = torch_backends[0]
        if first.extend_kernel is not None:
            choices.append(choose_prefill_attention(first, variance, measure))
        cascade = variance and first.softcap is None  # the cascade's merge cannot soft-cap
        for each in torch_backends:
            each.extend_kernel = first.extend_kernel
            each.decoder.cascade = cascade
        choices.append(Choice("decode cascade", "rows sharing a long KV prefix", "on" if cascade else "off",
                              "--enable-batch-variance" if cascade else "batch invariance"))
    for choice in choices:
        logger.info("engine: %s", choice.line())
    if measure:
        logger.info("engines measured and chosen in %.2f s on %s", time.perf_counter() - start, cpu_line())
    return choices


def choose_expert_padding(model: torch.nn.Module, variance: bool) -> list[Choice]:
    """MoE blocks: expert groups padded to ROW_TILE rows for batch invariance, unpadded with variance."""
    blocks = [m for m in model.modules() if isinstance(m, SparseMoeBlock)]
    if not blocks:
        return []
    tile = 1 if variance else ROW_TILE
    for block in blocks:
        block.row_tile = tile
    why = "--enable-batch-variance" if variance else "batch invariance: a group of 1-3 rows rounds differently"
    return [Choice("expert GEMM", f"{len(blocks)} sparse layers", f"groups padded to {tile} rows", why)]


def choose_block_gemm(model: torch.nn.Module, variance: bool, measure: bool) -> list[Choice]:
    """One choice per distinct block linear shape of the decoder (the head runs on a few rows only)."""
    by_shape: dict[tuple[str, int, int], list[BlockQuantLinearMethod]] = {}
    head = getattr(model, "lm_head", None)
    for layer in model.modules():
        method = getattr(layer, "method", None)
        if isinstance(layer, Linear) and layer is not head and isinstance(method, BlockQuantLinearMethod) \
                and method.kernels is not None:
            by_shape.setdefault((method.fmt.name, method.out_features, method.in_features), []).append(method)
    choices = []
    for (fmt, out, inp), methods in by_shape.items():
        shape = f"{fmt} {inp}->{out} x{len(methods)}"
        if not measure:
            choices.append(Choice("block GEMM", shape, _ours(methods[0]), UNMEASURED))
        else:
            choices.append(_choose_one_gemm(shape, methods, model_dtype(model), variance))
    return choices


def model_dtype(model: torch.nn.Module) -> torch.dtype:
    dtype = getattr(model, "dtype", torch.float32)
    return dtype if isinstance(dtype, torch.dtype) else torch.float32


def _choose_one_gemm(shape: str, methods: list[BlockQuantLinearMethod], dtype: torch.dtype, variance: bool
                     ) -> Choice:
    """Ours, or the library engine (kernels/block_engines.py) that wins from the fewest rows on."""
    probe = methods[0]
    ours = _ours(probe)
    blocks = probe.row_blocks()
    made = [(make, engine) for make in block_engines.CANDIDATES if (engine := make(blocks, probe.fmt, dtype))]
    if not made:
        return Choice("block GEMM", shape, ours, f"no library engine runs {probe.fmt.name} in {dtype} here")
    speedups = {engine.name: _speedups(probe, engine, dtype) for _, engine in made}
    measured = "; ".join(f"{name} measured " + ", ".join(f"{r} rows {s:.2f}x" for r, s in by_rows.items())
                         for name, by_rows in speedups.items()) + " of ours"
    # The engine that wins from the fewest rows on, then the one fastest at the most rows.
    winners = sorted((start, -speedups[engine.name][ROW_PROBES[-1]], i) for i, (_, engine) in enumerate(made)
                     if (start := dense_from_rows(speedups[engine.name])) is not None)
    if not winners:
        return Choice("block GEMM", shape, ours, measured)
    if not variance:
        return Choice("block GEMM", shape, ours, f"batch invariance: one engine for every row count; {measured} "
                                                 "(--enable-batch-variance)")
    from_rows, _, best = winners[0]
    make, engine = made[best]
    extra = 0
    for method in methods:
        copy = engine if method is probe else make(method.row_blocks(), method.fmt, dtype)
        method.use_dense(copy, from_rows)
        extra += copy.nbytes if copy is not None else 0
    return Choice("block GEMM", shape, f"{ours} below {from_rows} rows, {engine.name} from {from_rows}",
                  f"{measured}; +{extra / 2**20:.0f} MB for its copies")


def _ours(method: BlockQuantLinearMethod) -> str:
    return f"blocks-{ISA_NAMES[method.isa_code]}"


def _speedups(method: BlockQuantLinearMethod, engine: block_engines.DenseEngine, dtype: torch.dtype
              ) -> dict[int, float]:
    """Ours' time over `engine`'s for `method`'s weight, by row count."""
    kernels = method.kernels
    assert kernels is not None
    out = {}
    for rows in ROW_PROBES:
        x = torch.randn(rows, method.in_features).to(dtype)
        t_ours, t_lib = _alternate(
            lambda: kernels.quant_linear(x, method.grouped, method.fmt.code, method.isa_code,  # noqa: B023
                                         method.out_features, None),
            lambda: engine.run(x, None))  # noqa: B023 (both called at once)
        out[rows] = t_ours / t_lib
    return out


def dense_from_rows(speedups: dict[int, float]) -> int | None:
    """The smallest measured row count from which the dense engine wins by MARGIN at it and at
    every larger one (ours' time over its, by row count), or None."""
    rows = sorted(speedups)
    return next((r for r in rows if all(speedups[q] >= MARGIN for q in rows if q >= r)), None)


def choose_prefill_attention(backend: TorchAttentionBackend, variance: bool, measure: bool) -> Choice:
    """Ours or torch's path for prompt rows, measured on one layer of a pool like the model's."""
    shape = f"{backend.num_heads} heads over {backend.num_kv_heads} of {backend.head_dim}"
    if not measure:
        return Choice("prefill attention", shape, "ours", UNMEASURED)
    speedups = [_prefill_speedup(backend, new, prefix) for new, prefix in PREFILL_PROBES]
    measured = ", ".join(f"{new}+{prefix} {s:.2f}x" for (new, prefix), s in zip(PREFILL_PROBES, speedups))
    torch_wins = all(s >= MARGIN for s in speedups)
    if torch_wins and variance:
        backend.extend_kernel = None
        return Choice("prefill attention", shape, "torch", f"measured {measured} of ours")
    why = "batch invariance: ours is the same for a row however its prompt is chunked; " if torch_wins else ""
    return Choice("prefill attention", shape, "ours", f"{why}torch measured {measured} of ours")


def _prefill_speedup(backend: TorchAttentionBackend, new: int, prefix: int) -> float:
    """Ours' time over torch's for one request of `new` tokens over `prefix` cached ones."""
    seq = new + prefix
    pool = KVPool(1, seq + 1, backend.num_kv_heads, backend.head_dim, backend.pool.dtype, torch.device("cpu"), 1)
    slots = torch.arange(1, seq + 1)
    meta = ForwardMetadata(kv_indices=slots.to(torch.int32), positions=torch.arange(prefix, seq),
                           out_cache_loc=slots[prefix:], page_size=1, seq_lens=[seq], extend_lens=[new],
                           qo_indptr_host=torch.tensor([0, new], dtype=torch.int32),
                           kv_indptr_host=torch.tensor([0, seq], dtype=torch.int32),
                           kv_last_page_len_host=torch.ones(1, dtype=torch.int32))
    dtype = backend.pool.dtype
    q = torch.randn(new, backend.num_heads, backend.head_dim).to(dtype)
    k, v = (torch.randn(new, backend.num_kv_heads, backend.head_dim).to(dtype) for _ in range(2))
    trials = [TorchAttentionBackend(pool, backend.num_heads, backend.num_kv_heads, backend.head_dim, kernels)
              for kernels in (backend.extend_kernel, None)]
    for trial in trials:
        trial.plan(meta)
    t_ours, t_torch = _alternate(lambda: trials[0].forward(0, q, k, v), lambda: trials[1].forward(0, q, k, v))
    return t_ours / t_torch


def _alternate(first: Callable[[], object], second: Callable[[], object]) -> tuple[float, float]:
    """The fastest of REPEATS calls of each, taken in turn so that both see the same noise."""
    first(), second()  # warm: first-call allocations, oneDNN's primitive cache
    best = [float("inf"), float("inf")]
    for _ in range(REPEATS):
        for i, fn in enumerate((first, second)):
            start = time.perf_counter()
            fn()
            best[i] = min(best[i], time.perf_counter() - start)
    return best[0], best[1]


def cpu_line() -> str:
    """What the choices were measured on, for the log and the benchmark's first line."""
    return cpu_capability().describe()

