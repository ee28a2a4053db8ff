"""Weight loading: safetensors checkpoints (single file or sharded) and dummy random weights."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from typing import TYPE_CHECKING

import torch

from kernels import gguf_blocks, quant_linear
from kernels.gguf_blocks import FORMATS
from kernels.linear import Linear, LinearMethod, RowGemvLinearMethod
from runtime.execution.cpu_kernels import load_cpu_kernels
from runtime.execution.device import cpu_capability, should_prepack
from runtime.models import CausalLM, ModelConfig, build_model

if TYPE_CHECKING:
    from runtime.parallel.context import ParallelContext

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"


def safetensors_files(model_path: str) -> list[str]:
    """The checkpoint's .safetensors files, in index order; a clear error when there are none."""
    index = os.path.join(model_path, INDEX_FILE)
    if os.path.exists(index):
        with open(index) as fh:
            shards = sorted(set(json.load(fh)["weight_map"].values()))
        files = [os.path.join(model_path, name) for name in shards]
        missing = [f for f in files if not os.path.exists(f)]
        if missing:
            raise FileNotFoundError(f"{model_path}: {INDEX_FILE} lists missing shard(s) {missing}")
        return files
    single = os.path.join(model_path, SINGLE_FILE)
    if os.path.exists(single):
        return [single]
    found = sorted(f for f in os.listdir(model_path) if f.endswith(".safetensors")) if os.path.isdir(model_path) else []
    if found:
        return [os.path.join(model_path, f) for f in found]
    raise FileNotFoundError(f"no {SINGLE_FILE} or {INDEX_FILE} in model folder {model_path!r}")


def iter_safetensors(model_path: str) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield (name, tensor) for every tensor of the checkpoint, opening each shard once, lazily."""
    from safetensors import safe_open

    for path in safetensors_files(model_path):
        with safe_open(path, framework="pt", device="cpu") as f:
            for name in f.keys():  # noqa: SIM118 (a safe_open handle is not iterable)
                yield name, f.get_tensor(name)


def load_model(
    model_path: str | None,
    model_config: ModelConfig,
    dtype: torch.dtype,
    device: torch.device,
    load_format: str = "auto",
    seed: int = 0,
    prepack: bool | None = None,
    quantization: str | None = None,
    tp: ParallelContext | None = None,
    gguf_file: str | None = None,
) -> CausalLM:
    """Build the model on `device`, fill its weights, prepack them, and return it ready to run.

    load_format "auto" reads the safetensors in `model_path`; "dummy" fills random weights
    (normal, std 0.02; norms 1) from `seed` without reading any file. `prepack`: pack the linear
    weights for the device; None: where `runtime.execution.device.should_prepack` says it pays.
    "gguf" reads `gguf_file`, keeping the linears' quantized blocks (runtime/execution/gguf_weights.py).
    `quantization` "int8": the decoder's linears compute small-batch calls from per-channel int8
    weights (`Int8LinearMethod`, CPU only); "q8_0", "q4_0", "q4_1": the decoder's linears are
    quantized into those GGUF blocks and the head into q8_0 (`BlockQuantLinearMethod`, CPU only).
    `tp` (a `runtime.parallel.group.TensorParallel`): build and load only this rank's part.
    """
    if load_format not in ("auto", "dummy", "gguf"):
        raise ValueError(f"load_format must be 'auto', 'gguf' or 'dummy', got {load_format!r}")
    model = build_model(model_config, dtype, device, tp)
    if load_format == "dummy":
        init_dummy_weights(model, seed)
    elif load_format == "gguf":
        if device.type != "cpu" or gguf_file is None:
            raise ValueError("load_format gguf runs a .gguf file's blocks on CPU only")
        from runtime.execution.gguf_weights import load_gguf

        load_gguf(model, gguf_file, load_cpu_kernels(), cpu_capability().block_kernel_isa)
    else:
        if model_path is None:
            raise ValueError("model_path is required unless load_format='dummy'")
        model.load_weights(iter_safetensors(model_path))
    quantize(model, quantization, device)
    if should_prepack(device, dtype) if prepack is None else prepack:
        use_row_gemv(model, device, dtype)
        model.pack()
    return model.eval()


def use_row_gemv(model: CausalLM, device: torch.device, dtype: torch.dtype) -> None:
    """fp32 on CPU with our kernels built: the full-precision linears keep their plain weights and
    run decode rows through our GEMV (`RowGemvLinearMethod`) instead of being packed for oneDNN."""
    if device.type != "cpu" or dtype != torch.float32:
        return
    kernels = load_cpu_kernels()
    if kernels is None:
        return
    method = RowGemvLinearMethod(kernels)
    for layer in model.modules():
        if isinstance(layer, Linear) and type(layer.method) is LinearMethod:
            layer.method = method


def quantize(model: CausalLM, quantization: str | None, device: torch.device) -> None:
    """Swap the quantized product method into the model's quantizable linears (after loading,
    before packing: it quantizes the loaded full-precision weights)."""
    if quantization in (None, "none"):
        return
    if quantization not in ("int8", *FORMATS):
        raise ValueError(f"unknown quantization {quantization!r}; known: none, int8, {', '.join(FORMATS)}")
    if device.type != "cpu":
        raise ValueError(f"quantization {quantization} runs on CPU only")
    if quantization == "int8":
        for layer in model.quantizable_linears():
            layer.quantize_int8()
        return
    kernels, isa = load_cpu_kernels(), cpu_capability().block_kernel_isa
    # The head in q8_0 whatever the decoder's format (as llama.cpp's quantizer keeps it finer).
    layers = [(layer, FORMATS[quantization]) for layer in model.quantizable_linears()]
    layers.append((model.lm_head, FORMATS["q8_0"]))
    for layer, fmt in layers:
        assert layer.weight is not None, "quantize before pack()"
        quant_linear.install(layer, gguf_blocks.quantize(layer.weight.detach(), fmt), fmt, kernels, isa)


@torch.no_grad()
def init_dummy_weights(model: CausalLM, seed: int) -> None:
    """Normal(0, 0.02) weights and unit norms, drawn at the whole model's shapes (a meta-device
    copy gives them) so that a tensor-parallel rank holds its part of the same model. Drawn on the
    model's device (a GPU draws a billion numbers in milliseconds, a CPU core in seconds): the
    same seed gives the same model on every device of one kind."""
    device = next(model.parameters()).device
    gen = torch.Generator(device=device).manual_seed(seed)
    whole = build_model(model.global_config, model.dtype, torch.device("meta"))
    for name, param in whole.named_parameters():
        if name.endswith("norm.weight"):
            value = torch.ones(param.shape, device=device)
        else:
            value = torch.empty(param.shape, dtype=torch.float32, device=device).normal_(0.0, 0.02, generator=gen)
        model.fill_param(name, value)
