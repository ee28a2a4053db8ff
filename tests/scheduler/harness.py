"""Drive the scheduler in-process (no sockets) on a tiny random-weight Llama: shared test helpers.

`make` builds each scheduler with the real `build_scheduler`, but the loaded weights and the
tokenizer are reused between the schedulers of one test module (`reusing_loads`): a module builds
dozens of schedulers on the same checkpoint, and reading it again each time costs about a second.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from typing import Any

import torch
import transformers

from runtime.contracts.config import ServerConfig
from runtime.execution import weights
from runtime.execution.resolve import resolve_config
from runtime.support import tokenizer_load
from scheduler.process import build_scheduler
from scheduler.scheduler import Scheduler
from tests.scheduler.io_helpers import FakeIO, collect, submit

__all__ = ["VOCAB", "FakeIO", "collect", "make", "reusing_loads", "run_until_idle", "submit"]

VOCAB = 300


# Loaded models and tokenizers, by everything their load depends on; emptied after each test module
# (conftest.py) so that at most one module's models stay in memory.
_MODELS: dict[tuple[Any, ...], tuple[Any, torch.Tensor]] = {}
_TOKENIZERS: dict[tuple[Any, ...], Any] = {}


def clear_load_caches() -> None:
    _MODELS.clear()
    _TOKENIZERS.clear()


def _folder_stamp(path: str | None) -> tuple[tuple[str, int, int], ...]:
    """Name, size and mtime of each file in a model folder: a rewritten checkpoint is a new key."""
    if path is None or not os.path.isdir(path):
        return ()
    stats = ((name, os.stat(os.path.join(path, name))) for name in sorted(os.listdir(path)))
    return tuple((name, st.st_size, st.st_mtime_ns) for name, st in stats)


def _cached_load_model(real: Callable[..., Any]) -> Callable[..., Any]:
    def load(model_path: str | None, model_config: Any, dtype: torch.dtype, device: torch.device,
             load_format: str = "auto", seed: int = 0, prepack: bool | None = None,
             quantization: str | None = None, tp: Any = None, gguf_file: str | None = None) -> Any:
        if tp is not None or device.type != "cpu":  # a rank's part, or device memory: always fresh
            return real(model_path, model_config, dtype, device, load_format, seed, prepack, quantization, tp,
                        gguf_file)
        key = (model_path, _folder_stamp(model_path), repr(model_config), dtype, load_format, seed, prepack,
               quantization, gguf_file)
        if key not in _MODELS:
            model = real(model_path, model_config, dtype, device, load_format, seed, prepack, quantization, tp,
                         gguf_file)
            # Building the model draws from torch's RNG, which sampling without a seed uses next:
            # a reused model leaves the RNG where a fresh load would.
            _MODELS[key] = (model, torch.get_rng_state())
        model, rng_after_load = _MODELS[key]
        torch.set_rng_state(rng_after_load)
        return model

    return load


def _cached_tokenizer(real: Callable[..., Any]) -> Callable[..., Any]:
    def load(path: str, *args: Any, **kwargs: Any) -> Any:
        key = (real.__qualname__, path, _folder_stamp(path), args, tuple(sorted(kwargs.items())))
        if key not in _TOKENIZERS:
            _TOKENIZERS[key] = real(path, *args, **kwargs)
        return _TOKENIZERS[key]

    return load


@contextmanager
def _replaced(owner: Any, name: str, wrap: Callable[[Callable[..., Any]], Callable[..., Any]]) -> Iterator[None]:
    """`owner.name` replaced by `wrap(owner.name)` while open, then restored as it was (a
    classmethod stays a classmethod)."""
    saved = vars(owner)[name]
    setattr(owner, name, wrap(getattr(owner, name)))
    try:
        yield
    finally:
        setattr(owner, name, saved)


@contextmanager
def reusing_loads() -> Iterator[None]:
    """While open, `build_scheduler` gets the model and tokenizer of an earlier build on the same
    checkpoint and settings. Sound because neither holds per-scheduler state: the model is only
    read (each scheduler gets its own KV pool, request table and attention backend in
    `load_model_for_serving`), and the tokenizer is used to decode and to build grammar info.
    Both are looked up at call time (`from module import name` inside the functions)."""
    with ExitStack() as stack:
        stack.enter_context(_replaced(weights, "load_model", _cached_load_model))
        stack.enter_context(_replaced(tokenizer_load, "load_tokenizer", _cached_tokenizer))
        stack.enter_context(_replaced(transformers.AutoTokenizer, "from_pretrained", _cached_tokenizer))
        yield


def make(tiny_model: str, **overrides: Any) -> tuple[Scheduler, FakeIO]:
    io = FakeIO()
    cfg = dict(model_path=tiny_model, device="cpu", dtype="float32", max_total_tokens=2048, max_running_requests=16,
               disable_overlap_schedule=True)
    cfg.update(overrides)
    with reusing_loads():
        return build_scheduler(resolve_config(ServerConfig(**cfg)), io), io


def run_until_idle(sched: Scheduler, io: FakeIO, max_steps: int = 5000) -> dict[str, dict[str, Any]]:
    """Drive the scheduler's own loop (overlapped or not) until it is idle."""
    for _ in range(max_steps):
        sched.step()
        if sched.is_idle and not io.inbox and sched.in_flight is None:
            break
    else:
        raise AssertionError("scheduler did not go idle")
    sched.check_idle_integrity()
    return collect(io)
