"""The pooling read from a sentence-transformers folder, and how a vector is finished."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from runtime.contracts.pooling import Pooling, cosine, finish_embedding, normalized, read_pooling

ST_MODULES = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
              {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]
NORMALIZE = {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"}


def _folder(tmp_path: Path, modules: list[dict[str, object]] | None, pooling: dict[str, bool] | None) -> str:
    if modules is not None:
        (tmp_path / "modules.json").write_text(json.dumps(modules))
    if pooling is not None:
        (tmp_path / "1_Pooling").mkdir()
        (tmp_path / "1_Pooling" / "config.json").write_text(json.dumps({"word_embedding_dimension": 8, **pooling}))
    return str(tmp_path)


def test_a_folder_without_sentence_transformers_files_gets_its_kinds_default(tmp_path: Path) -> None:
    assert read_pooling(str(tmp_path), is_encoder=False) == Pooling("last", True)
    assert read_pooling(str(tmp_path), is_encoder=True) == Pooling("mean", True)


@pytest.mark.parametrize("key,mode", [("pooling_mode_mean_tokens", "mean"), ("pooling_mode_cls_token", "cls"),
                                      ("pooling_mode_lasttoken", "last")])
@pytest.mark.parametrize("normalize", [False, True])
def test_the_pooling_module_and_normalize_are_read(tmp_path: Path, key: str, mode: str, normalize: bool) -> None:
    modules = ST_MODULES + ([NORMALIZE] if normalize else [])
    path = _folder(tmp_path, modules, {key: True, "pooling_mode_max_tokens": False})
    assert read_pooling(path, is_encoder=True) == Pooling(mode, normalize)  # type: ignore[arg-type]


def test_an_unsupported_pooling_is_refused_not_replaced(tmp_path: Path) -> None:
    path = _folder(tmp_path, ST_MODULES, {"pooling_mode_mean_tokens": True, "pooling_mode_max_tokens": True})
    with pytest.raises(ValueError, match="pooling"):
        read_pooling(path, is_encoder=True)


def test_finish_normalizes_and_cuts_to_dimensions_then_normalizes_again() -> None:
    raw = [3.0, 4.0, 12.0]
    assert finish_embedding(raw, Pooling("last", False)) == raw
    unit = finish_embedding(raw, Pooling("last", True))
    assert math.isclose(math.hypot(*unit), 1.0)
    cut = finish_embedding(raw, Pooling("last", True), dimensions=2)
    assert cut == pytest.approx([0.6, 0.8])
    assert finish_embedding(raw, Pooling("last", True), dimensions=3) == unit
    assert normalized([0.0, 0.0]) == [0.0, 0.0]


def test_cosine() -> None:
    assert cosine([1.0, 0.0], [2.0, 0.0]) == pytest.approx(1.0)
    assert cosine([1.0, 0.0], [0.0, 3.0]) == pytest.approx(0.0)
    assert cosine([1.0, 1.0], [-1.0, -1.0]) == pytest.approx(-1.0)
    assert cosine([0.0, 0.0], [1.0, 0.0]) == 0.0
