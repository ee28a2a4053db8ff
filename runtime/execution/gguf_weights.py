"""Load a .gguf file's weights keeping its quantized blocks (`--load-format gguf`, CPU).

Every linear stored in a block format our kernels run (q8_0, q4_0, q4_1, q5_0, q5_1, Q4_K, Q5_K,
Q6_K) keeps its blocks, in a `BlockQuantLinearMethod`: no full-precision copy. The fused
projections (q/k/v, gate/up) concatenate their parts' rows, which is exact since blocks never
cross rows; parts in different formats (llama-quantize's _M mixes) each keep their own
(`BlockPartsLinearMethod`). Tensors in other formats (F32 norms, F16/BF16, other quants) are
dequantized once at load, and one log line names the quantized ones among them. The output head
is the file's `output.weight`, or `token_embd.weight` when the model ties them, as llama.cpp
does; the embedding lookup decodes the rows it looks up from the file's blocks when their format
is one of ours (else it keeps a dequantized table).

llama.cpp's converter permutes the rows of a llama model's q and k projections (its rotary
pairs neighbouring dimensions, Hugging Face's the two halves); `_unpermute_rows` undoes it.
"""

from __future__ import annotations

import itertools
import logging
import re
from collections import Counter
from types import ModuleType

import numpy as np
import torch

from kernels import quant_linear
from kernels.gguf_blocks import KERNEL_FORMATS, BlockFormat
from kernels.linear import Linear
from kernels.quant_linear import block_parts
from runtime.models import CausalLM
from runtime.models.base import FUSED_SHARDS  # the fused layers and the order of their parts' rows

logger = logging.getLogger("radixserve.setup")

# GGML type name -> our block format (kernels/gguf_blocks.py KERNEL_FORMATS)
KEPT_TYPES = {"Q8_0": "q8_0", "Q4_0": "q4_0", "Q4_1": "q4_1", "Q5_0": "q5_0", "Q5_1": "q5_1", "Q4_K": "q4_k",
              "Q5_K": "q5_k", "Q6_K": "q6_k"}
_LAYER_NAMES = {
    "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj", "attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm",
    "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj",
}
_TOP_NAMES = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}


def hf_name(gguf_name: str) -> str:
    """`blk.3.attn_q.weight` -> `model.layers.3.self_attn.q_proj.weight`."""
    base, _, suffix = gguf_name.rpartition(".")
    match = re.fullmatch(r"blk\.(\d+)\.(\w+)", base)
    if match and match.group(2) in _LAYER_NAMES:
        return f"model.layers.{match.group(1)}.{_LAYER_NAMES[match.group(2)]}.{suffix}"
    if base in _TOP_NAMES:
        return f"{_TOP_NAMES[base]}.{suffix}"
    raise ValueError(f"GGUF tensor {gguf_name!r} has no place in the model")


def _unpermute_rows(rows: torch.Tensor, heads: int) -> torch.Tensor:
    """Undo llama.cpp's q/k row permutation (its convert_hf_to_gguf `permute`)."""
    out = rows.shape[0]
    # Our row (head h, half a, index d) is their row (h, d, a).
    source = torch.arange(out).reshape(heads, out // heads // 2, 2).transpose(1, 2).reshape(-1)
    return rows[source]


def _rows_for(name: str, rows: torch.Tensor, model: CausalLM, arch: str) -> torch.Tensor:
    if arch != "llama" or not name.endswith((".q_proj.weight", ".k_proj.weight")):
        return rows
    cfg = model.global_config
    heads = cfg.num_heads if ".q_proj." in name else cfg.num_kv_heads
    return _unpermute_rows(rows, heads)


def _dequantized(tensor: object) -> torch.Tensor:
    from gguf import GGMLQuantizationType, quants

    data = tensor.data  # type: ignore[attr-defined]
    kind = tensor.tensor_type  # type: ignore[attr-defined]
    if kind in (GGMLQuantizationType.F32, GGMLQuantizationType.F16):
        return torch.from_numpy(np.array(data, dtype=np.float32))
    return torch.from_numpy(np.array(quants.dequantize(data, kind), dtype=np.float32))


def load_gguf(model: CausalLM, gguf_file: str, kernels: ModuleType | None, isa: str) -> None:
    """Fill `model` from `gguf_file`: block linears stay in their blocks, the rest dequantized."""
    from gguf import GGUFReader

    if model.config != model.global_config:
        raise ValueError("load_format gguf runs on one rank only (no tensor parallelism yet)")
    reader = GGUFReader(gguf_file)
    field = reader.fields["general.architecture"]
    arch = bytes(field.parts[field.data[0]]).decode()
    blocks: dict[str, list[tuple[int, str, torch.Tensor]]] = {}  # layer -> (part, format, rows)
    dense: dict[str, torch.Tensor] = {}
    dequantized: list[str] = []
    embedding_blocks: tuple[int, str, torch.Tensor] | None = None  # the token embedding's, in a kept format
    for tensor in reader.tensors:
        name = hf_name(tensor.name)
        kind = tensor.tensor_type.name
        if kind in KEPT_TYPES and name == "model.embed_tokens.weight":
            embedding_blocks = (0, KEPT_TYPES[kind], torch.from_numpy(np.array(tensor.data, dtype=np.uint8)))
        elif kind in KEPT_TYPES and name.endswith(".weight"):
            rows = _rows_for(name, torch.from_numpy(np.array(tensor.data, dtype=np.uint8)), model, arch)
            layer, part = _layer_part(name)
            blocks.setdefault(layer, []).append((part, KEPT_TYPES[kind], rows))
            continue
        elif kind not in ("F32", "F16", "BF16") and name != "model.embed_tokens.weight":
            dequantized.append(f"{tensor.name} ({kind})")
        dense[name] = _rows_for(name, _dequantized(tensor), model, arch)  # the embedding lookup's table too
    if dequantized:
        logger.info("GGUF tensors in formats our kernels lack, dequantized once: %s", ", ".join(dequantized))
    if model.config.tie_word_embeddings and "lm_head" not in blocks and embedding_blocks is not None:
        blocks["lm_head"] = [embedding_blocks]  # computes from the token embedding's blocks, as llama.cpp
    _install_blocks(model, blocks, kernels, isa)
    model.load_weights(dense.items())  # a tied head's lm_head.weight, if any, is skipped there
    head_shares_table = model.config.tie_word_embeddings and model.lm_head.weight is not None
    if embedding_blocks is not None and not head_shares_table:  # the lookup decodes its rows from the blocks
        model.model.embed_tokens.use_blocks(embedding_blocks[2], KERNEL_FORMATS[embedding_blocks[1]])
    kept = [part for m in model.modules() if isinstance(m, Linear) for part in block_parts(m.method)]
    counts = Counter(method.fmt.name for method in kept)
    logger.info("%s: %d linears run from their blocks (%s; %.0f MB), the %s kernel variant", gguf_file, len(kept),
                ", ".join(f"{n} {name}" for name, n in sorted(counts.items())),
                sum(method.nbytes for method in kept) / 1e6, isa)


def _layer_part(name: str) -> tuple[str, int]:
    """The module that computes with `name` and its part (row block) in it."""
    module = name.removesuffix(".weight")
    prefix, _, leaf = module.rpartition(".")
    if leaf in FUSED_SHARDS:
        fused, part = FUSED_SHARDS[leaf]
        return f"{prefix}.{fused}", part
    return module, 0


def _install_blocks(model: CausalLM, blocks: dict[str, list[tuple[int, str, torch.Tensor]]],
                    kernels: ModuleType | None, isa: str) -> None:
    for layer_name, parts in blocks.items():
        layer = model.get_submodule(layer_name)
        assert isinstance(layer, Linear), layer_name
        parts.sort(key=lambda p: p[0])
        formats = {fmt for _, fmt, _ in parts}
        if len(formats) == 1:
            fmt: BlockFormat = KERNEL_FORMATS[formats.pop()]
            quant_linear.install(layer, torch.cat([rows for _, _, rows in parts]), fmt, kernels, isa)
        else:  # a fused layer's parts in different formats: each run of one format from its own blocks
            runs = [(torch.cat([rows for _, _, rows in group]), KERNEL_FORMATS[name])
                    for name, group in itertools.groupby(parts, key=lambda part: part[1])]
            quant_linear.install_parts(layer, runs, kernels, isa)
