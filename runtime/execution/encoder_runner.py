"""The encoder's runner: a batch of token-id lists in, one pooled vector per input out.

No KV pool, no request table, no sampling: the inputs are padded to the longest, run in one
forward with a padding mask, and pooled as the model's sentence-transformers config says
(`runtime.contracts.pooling`); normalization and `dimensions` are the main process's.
"""

from __future__ import annotations

import torch

from runtime.contracts.config import ServerConfig, read_model_json
from runtime.contracts.encoder_config import EncoderConfig
from runtime.contracts.pooling import Pooling, read_pooling
from runtime.execution.device import DTYPES, prepare_torch
from runtime.models.bert import BertModel, load_bert_weights


class EncoderRunner:
    """Owns the encoder model; `embed` is its one job."""

    def __init__(self, model: BertModel, pooling: Pooling, device: torch.device) -> None:
        self.model = model
        self.pooling = pooling
        self.device = device
        self.forward_count = 0

    @classmethod
    def load(cls, config: ServerConfig) -> EncoderRunner:
        """The resolved config's encoder, its weights loaded (random with --load-format dummy)."""
        from runtime.execution.weights import iter_safetensors

        assert config.model_path and config.device != "auto", "resolve_config() first"
        prepare_torch(config)
        cfg = EncoderConfig.from_hf(read_model_json(config.model_path, "config.json"))
        device = torch.device(config.device)
        model = BertModel(cfg)
        if config.load_format != "dummy":
            load_bert_weights(model, iter_safetensors(config.model_path))
        model = model.to(device=device, dtype=DTYPES[config.dtype]).eval()
        return cls(model, read_pooling(config.model_path, is_encoder=True), device)

    @property
    def hidden_size(self) -> int:
        return self.model.config.hidden_size

    @torch.inference_mode()
    def embed(self, batch: list[list[int]]) -> list[list[float]]:
        """Each input's pooled final hidden state (fp32 values), in batch order."""
        width = max(len(ids) for ids in batch)
        ids = torch.zeros((len(batch), width), dtype=torch.int64)
        mask = torch.zeros((len(batch), width), dtype=torch.int64)
        for i, row in enumerate(batch):
            ids[i, : len(row)] = torch.tensor(row, dtype=torch.int64)
            mask[i, : len(row)] = 1
        ids, mask = ids.to(self.device), mask.to(self.device)
        hidden = self.model(ids, mask).float()
        self.forward_count += 1
        return pool(hidden, mask, self.pooling).cpu().tolist()


def pool(hidden: torch.Tensor, mask: torch.Tensor, pooling: Pooling) -> torch.Tensor:
    """hidden [B, L, H], mask [B, L] (1: real token) -> [B, H] by the pooling's mode."""
    if pooling.mode == "cls":
        return hidden[:, 0]
    if pooling.mode == "last":
        last = mask.sum(dim=1) - 1
        return hidden[torch.arange(hidden.shape[0], device=hidden.device), last]
    weights = mask.to(hidden.dtype).unsqueeze(-1)
    return (hidden * weights).sum(dim=1) / weights.sum(dim=1).clamp(min=1e-9)
