"""BERT, the encoder: bidirectional attention over a padded batch, absolute position and token
type embeddings, post-LayerNorm residual blocks, exact (erf) GELU. It keeps no KV cache: every
forward sees each input whole, so a batch of inputs is one call.

Parameter names are Hugging Face's `BertModel` names (`embeddings.word_embeddings.weight`,
`encoder.layer.0.attention.self.query.weight`, ...), so a checkpoint loads by name
(`load_bert_weights`); a `bert.` prefix (BertForMaskedLM) is dropped and heads are ignored.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
import torch.nn.functional as F
from torch import nn

from runtime.contracts.encoder_config import EncoderConfig


class BertEmbeddings(nn.Module):
    def __init__(self, cfg: EncoderConfig) -> None:
        super().__init__()
        self.word_embeddings = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.position_embeddings = nn.Embedding(cfg.max_position_embeddings, cfg.hidden_size)
        self.token_type_embeddings = nn.Embedding(cfg.type_vocab_size, cfg.hidden_size)
        self.LayerNorm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(input_ids.shape[1], device=input_ids.device)
        x = self.word_embeddings(input_ids) + self.token_type_embeddings(token_type_ids)
        out: torch.Tensor = self.LayerNorm(x + self.position_embeddings(positions)[None])
        return out


class BertSelfAttention(nn.Module):
    def __init__(self, cfg: EncoderConfig) -> None:
        super().__init__()
        self.heads, self.head_dim = cfg.num_heads, cfg.head_dim
        self.query = nn.Linear(cfg.hidden_size, cfg.hidden_size)
        self.key = nn.Linear(cfg.hidden_size, cfg.hidden_size)
        self.value = nn.Linear(cfg.hidden_size, cfg.hidden_size)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """x [B, L, H], mask bool [B, 1, 1, L] (True: a real token) -> [B, L, H]."""
        b, n, _ = x.shape

        def heads(t: torch.Tensor) -> torch.Tensor:
            return t.view(b, n, self.heads, self.head_dim).transpose(1, 2)

        out = F.scaled_dot_product_attention(heads(self.query(x)), heads(self.key(x)), heads(self.value(x)), mask)
        return out.transpose(1, 2).reshape(b, n, -1)


class BertDense(nn.Module):
    """A projection, then residual + LayerNorm (post-LN): HF's BertSelfOutput and BertOutput."""

    def __init__(self, cfg: EncoderConfig, size_in: int) -> None:
        super().__init__()
        self.dense = nn.Linear(size_in, cfg.hidden_size)
        self.LayerNorm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)

    def forward(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.LayerNorm(self.dense(x) + residual)
        return out


class BertAttention(nn.Module):
    def __init__(self, cfg: EncoderConfig) -> None:
        super().__init__()
        self.self = BertSelfAttention(cfg)
        self.output = BertDense(cfg, cfg.hidden_size)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.output(self.self(x, mask), x)
        return out


class BertIntermediate(nn.Module):
    def __init__(self, cfg: EncoderConfig) -> None:
        super().__init__()
        self.dense = nn.Linear(cfg.hidden_size, cfg.intermediate_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.gelu(self.dense(x))


class BertLayer(nn.Module):
    def __init__(self, cfg: EncoderConfig) -> None:
        super().__init__()
        self.attention = BertAttention(cfg)
        self.intermediate = BertIntermediate(cfg)
        self.output = BertDense(cfg, cfg.intermediate_size)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        x = self.attention(x, mask)
        out: torch.Tensor = self.output(self.intermediate(x), x)
        return out


class BertEncoder(nn.Module):
    def __init__(self, cfg: EncoderConfig) -> None:
        super().__init__()
        self.layer = nn.ModuleList(BertLayer(cfg) for _ in range(cfg.num_layers))

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        for layer in self.layer:
            x = layer(x, mask)
        return x


class BertModel(nn.Module):
    """Token ids of a padded batch -> the last layer's hidden states."""

    architectures = ("BertModel", "BertForMaskedLM", "BertForPreTraining")

    def __init__(self, cfg: EncoderConfig) -> None:
        super().__init__()
        self.config = cfg
        self.embeddings = BertEmbeddings(cfg)
        self.encoder = BertEncoder(cfg)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """input_ids, attention_mask int64 [B, L] (1: a real token, 0: padding) -> [B, L, H].
        Every token type is 0: one segment per input."""
        mask = attention_mask.bool()[:, None, None, :]
        x = self.embeddings(input_ids, torch.zeros_like(input_ids))
        out: torch.Tensor = self.encoder(x, mask)
        return out


SKIPPED_PREFIXES = ("cls.", "pooler.")  # heads this encoder does not run (MLM, next-sentence, pooler)


def load_bert_weights(model: BertModel, tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
    """Copy a checkpoint's tensors into `model` by name; every parameter must be given."""
    params = dict(model.named_parameters())
    seen: set[str] = set()
    for name, tensor in tensors:
        name = name.removeprefix("bert.")
        if name.startswith(SKIPPED_PREFIXES) or name.endswith("position_ids"):
            continue
        if name not in params:
            raise ValueError(f"unexpected BERT tensor {name!r}")
        with torch.no_grad():
            params[name].copy_(tensor)
        seen.add(name)
    missing = sorted(set(params) - seen)
    if missing:
        raise ValueError(f"the checkpoint lacks BERT tensors {missing[:4]}{' ...' if len(missing) > 4 else ''}")
