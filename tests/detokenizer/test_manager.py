"""Tests for DetokenizerManager.handle_batch (no sockets), on the default model's tokenizer."""

from __future__ import annotations

from typing import Any

import pytest

from detokenizer.manager import DetokenizerManager
from runtime.contracts.messages import BatchTokenOut

IM_END = 2  # SmolLM2's <|im_end|>, a special token


@pytest.fixture(scope="module")
def tokenizer(default_model_path: str) -> Any:
    import transformers

    return transformers.AutoTokenizer.from_pretrained(default_model_path)


def _out(entries: list[dict[str, Any]]) -> BatchTokenOut:
    """A BatchTokenOut from per-request dicts (rid and new_ids required, the rest defaulted)."""
    defaults: dict[str, Any] = {
        "finished_reasons": None, "decode_prefix": None, "prompt_tokens": 4,
        "completion_tokens": 1, "cached_tokens": 0, "skip_special_tokens": True,
        "spaces_between_special_tokens": True, "stop_strs": [], "no_stop_trim": False,
        "matched_stop_token": False, "output_logprobs": None, "output_top_logprobs": None,
        "input_logprobs": None, "input_top_logprobs": None, "input_ids_for_logprobs": None,
    }
    cols: dict[str, list[Any]] = {"rids": [], "new_ids": [], **{k: [] for k in defaults}}
    for e in entries:
        cols["rids"].append(e["rid"])
        cols["new_ids"].append(e["new_ids"])
        for k, v in defaults.items():
            cols[k].append(e.get(k, v))
    return BatchTokenOut(**cols)


def test_batched_deltas_concatenate_and_fields_pass_through(tokenizer: Any) -> None:
    texts = {"a": "Hello there, how are you today?", "b": "café 🙂 naïve 中文"}
    ids = {rid: tokenizer.encode(t) for rid, t in texts.items()}
    mgr = DetokenizerManager(tokenizer)
    got = {rid: "" for rid in texts}
    steps = max(len(v) for v in ids.values())
    for k in range(steps):
        entries = []
        for rid, toks in ids.items():
            if k >= len(toks):
                continue
            last = k == len(toks) - 1
            reason = {"type": "length", "length": k + 1} if last else None
            entries.append({"rid": rid, "new_ids": toks[k:k + 1], "completion_tokens": k + 1,
                            "finished_reasons": reason, "output_logprobs": [-0.25],
                            "cached_tokens": 2})
        out = _out(entries)
        res = mgr.handle_batch(out)
        assert res.rids == out.rids and res.output_ids == out.new_ids
        assert res.finished_reasons == out.finished_reasons
        assert res.completion_tokens == out.completion_tokens
        assert res.cached_tokens == [2] * len(entries)
        assert res.output_logprobs == [[-0.25]] * len(entries)
        for rid, text in zip(res.rids, res.texts):
            assert "\ufffd" not in text
            got[rid] += text
    assert got == texts
    assert len(mgr.table) == 0  # finished requests are forgotten


def test_stop_token_is_trimmed_unless_no_stop_trim(tokenizer: Any) -> None:
    ids = tokenizer.encode("Sure thing") + [IM_END]
    stop = {"type": "stop", "matched": IM_END}
    mgr = DetokenizerManager(tokenizer)
    base = {"new_ids": ids, "finished_reasons": stop, "skip_special_tokens": False,
            "matched_stop_token": True}
    res = mgr.handle_batch(_out([{"rid": "trim", **base},
                                 {"rid": "keep", **base, "no_stop_trim": True}]))
    assert res.texts == ["Sure thing", "Sure thing<|im_end|>"]
    assert res.output_ids == [ids, ids]


def test_stop_string_is_held_back_then_cut(tokenizer: Any) -> None:
    """The scheduler ends the request at the token that completes the stop string, and names it."""
    ids = tokenizer.encode("one two STOP")
    mgr = DetokenizerManager(tokenizer)
    texts = []
    for k, tok in enumerate(ids):
        last = k == len(ids) - 1
        res = mgr.handle_batch(_out([{
            "rid": "s", "new_ids": [tok], "stop_strs": ["STOP"],
            "finished_reasons": {"type": "stop", "matched": "STOP"} if last else None}]))
        texts.append(res.texts[0])
    assert "".join(texts) == "one two "


def test_decode_prefix_and_empty_abort(tokenizer: Any) -> None:
    prompt = tokenizer.encode("The answer is")
    out_ids = tokenizer.encode(" forty two")
    mgr = DetokenizerManager(tokenizer)
    res = mgr.handle_batch(_out([
        {"rid": "p", "new_ids": out_ids, "decode_prefix": prompt[-5:]},
        {"rid": "gone", "new_ids": [], "finished_reasons": {"type": "abort", "message": "x"}},
    ]))
    assert res.texts == [" forty two", ""]
    assert "p" in mgr.table and "gone" not in mgr.table


def test_an_inconsistent_request_fails_alone_and_the_process_goes_on(tokenizer: Any) -> None:
    """A rid twice in one step (the first entry final), and an id the tokenizer cannot decode:
    those requests end with finish_reason abort and FAILED_KEY; the others decode as usual."""
    from runtime.contracts.messages import FAILED_KEY

    mgr = DetokenizerManager(tokenizer)
    hello = tokenizer.encode("Hello")
    done = {"type": "length", "length": 1}
    res = mgr.handle_batch(_out([
        {"rid": "ok", "new_ids": hello},
        {"rid": "d", "new_ids": hello, "finished_reasons": done},
        {"rid": "d", "new_ids": hello},
        {"rid": "bad", "new_ids": [10**12]},
    ]))
    assert res.texts[0] == "Hello" and res.finished_reasons[0] is None
    for i in (2, 3):
        reason = res.finished_reasons[i]
        assert reason is not None and reason["type"] == "abort" and reason[FAILED_KEY] is True, reason
    assert "d" not in mgr.table and "bad" not in mgr.table and "ok" in mgr.table
    res = mgr.handle_batch(_out([{"rid": "ok", "new_ids": tokenizer.encode(" world"), "finished_reasons": done}]))
    assert res.texts == [" world"] and len(mgr.table) == 0
