"""The one place that chooses the device, the dtype and the attention backend.

Everything else receives a `torch.device`, a `torch.dtype` and a backend name from here.
"""

from __future__ import annotations

import torch

DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
}


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def resolve_dtype(name: str, checkpoint_dtype: str | None, device: torch.device) -> torch.dtype:
    """`auto` keeps the checkpoint's dtype, except fp32 checkpoints on CUDA run in bf16."""
    if name != "auto":
        return DTYPES[name]
    dtype = DTYPES.get(checkpoint_dtype or "", torch.bfloat16)
    if device.type == "cuda" and dtype == torch.float32:
        return torch.bfloat16
    return dtype


def resolve_attention_backend(name: str, device: torch.device) -> str:
    """`auto` picks flashinfer on CUDA when it imports, torch otherwise."""
    if name != "auto":
        return name
    if device.type == "cuda":
        try:
            import flashinfer  # noqa: F401
        except ImportError:
            return "torch"
        return "flashinfer"
    return "torch"


def dtype_name(dtype: torch.dtype) -> str:
    return {v: k for k, v in DTYPES.items()}[dtype]
