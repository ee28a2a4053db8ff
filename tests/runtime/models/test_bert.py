"""Our BERT encoder against Hugging Face's on tiny random checkpoints, and its runner's pooling."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import transformers

from runtime.contracts.config import ServerConfig
from runtime.contracts.encoder_config import EncoderConfig, is_encoder
from runtime.contracts.errors import UnsupportedModel
from runtime.contracts.pooling import Pooling
from runtime.execution.encoder_runner import EncoderRunner, pool
from runtime.models.bert import BertModel, load_bert_weights

TINY: dict[str, Any] = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                            vocab_size=256, max_position_embeddings=128, type_vocab_size=2, hidden_dropout_prob=0.0,
                            attention_probs_dropout_prob=0.0)


def _hf(cls: str = "BertModel", seed: int = 0) -> transformers.PreTrainedModel:
    torch.manual_seed(seed)
    model = getattr(transformers, cls)(transformers.BertConfig(**TINY)).eval()
    with torch.no_grad():  # norms and biases off their init too, so a wrong name or order shows
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    return model


def _ours(hf: transformers.PreTrainedModel) -> BertModel:
    model = BertModel(EncoderConfig.from_hf(hf.config.to_dict()))
    load_bert_weights(model, hf.state_dict().items())
    return model.eval()


BATCH = [[5, 17, 99, 3, 250, 8, 1], [5, 42, 1], [7]]


def _padded(batch: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(map(len, batch))
    ids = torch.tensor([row + [0] * (width - len(row)) for row in batch])
    mask = torch.tensor([[1] * len(row) + [0] * (width - len(row)) for row in batch])
    return ids, mask


@pytest.mark.parametrize("cls", ["BertModel", "BertForMaskedLM"])
def test_hidden_states_match_hugging_face_with_padding(cls: str) -> None:
    hf = _hf(cls)
    ours = _ours(hf)
    ids, mask = _padded(BATCH)
    with torch.no_grad():
        want = hf(input_ids=ids, attention_mask=mask, output_hidden_states=True).hidden_states[-1]
        got = ours(ids, mask)
    real = mask.bool()
    torch.testing.assert_close(got[real], want[real], atol=1e-5, rtol=1e-5)


def test_padding_does_not_change_an_inputs_hidden_states() -> None:
    ours = _ours(_hf())
    ids, mask = _padded(BATCH)
    with torch.no_grad():
        batched = ours(ids, mask)
        alone = ours(torch.tensor([BATCH[1]]), torch.ones(1, len(BATCH[1]), dtype=torch.int64))
    torch.testing.assert_close(batched[1, : len(BATCH[1])], alone[0], atol=1e-5, rtol=1e-5)


def test_a_checkpoint_missing_a_tensor_or_with_a_stranger_is_refused() -> None:
    hf = _hf()
    state = dict(hf.state_dict())
    ours = BertModel(EncoderConfig.from_hf(hf.config.to_dict()))
    with pytest.raises(ValueError, match="lacks"):
        load_bert_weights(ours, [(k, v) for k, v in state.items() if "layer.1." not in k])
    with pytest.raises(ValueError, match="unexpected"):
        load_bert_weights(ours, [*state.items(), ("encoder.extra.weight", torch.zeros(1))])


def test_pooling_modes() -> None:
    hidden = torch.arange(2 * 3 * 2, dtype=torch.float32).view(2, 3, 2)
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    torch.testing.assert_close(pool(hidden, mask, Pooling("cls", True)), hidden[:, 0])
    torch.testing.assert_close(pool(hidden, mask, Pooling("last", True)), torch.stack([hidden[0, 2], hidden[1, 1]]))
    torch.testing.assert_close(pool(hidden, mask, Pooling("mean", True)),
                               torch.stack([hidden[0].mean(0), hidden[1, :2].mean(0)]))


def test_the_runner_loads_a_folder_and_mean_pools_like_hugging_face(tmp_path: Path) -> None:
    hf = _hf()
    hf.save_pretrained(tmp_path)
    config = ServerConfig(model_path=str(tmp_path), device="cpu", dtype="float32", num_threads=1)
    runner = EncoderRunner.load(config)
    assert runner.pooling == Pooling("mean", True) and runner.hidden_size == 64
    got = torch.tensor(runner.embed(BATCH))
    ids, mask = _padded(BATCH)
    with torch.no_grad():
        hidden = hf(input_ids=ids, attention_mask=mask).last_hidden_state
    want = (hidden * mask[..., None]).sum(1) / mask.sum(1, keepdim=True)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_which_configs_are_encoders() -> None:
    assert is_encoder({"architectures": ["BertModel"]})
    assert is_encoder({"model_type": "bert"})
    assert not is_encoder({"architectures": ["LlamaForCausalLM"], "model_type": "llama"})
    with pytest.raises(UnsupportedModel, match="hidden_act"):
        EncoderConfig.from_hf({**transformers.BertConfig(**TINY).to_dict(), "hidden_act": "relu"})
    with pytest.raises(UnsupportedModel, match="position_embedding_type"):
        EncoderConfig.from_hf({**transformers.BertConfig(**TINY).to_dict(), "position_embedding_type": "relative_key"})
