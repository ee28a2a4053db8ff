"""Tests for detokenizer/incremental.py and detokenizer/stop.py, on the default model's
byte-level BPE tokenizer (emoji and CJK characters span several tokens)."""

from __future__ import annotations

import random
from collections.abc import Iterator, Sequence
from typing import Any

import pytest

from detokenizer.incremental import DecodeOptions, DecodeState, DecodeStateTable
from runtime.contracts.stop import find_stop, max_stop_len, partial_stop_suffix_len

FFFD = "\ufffd"
IM_START, IM_END = 1, 2

TEXTS = [
    "Hello, world! This is a test.\nNew line here.\n\nTwo blank lines.",
    "🙂🚀👩‍💻",
    "你好，世界。日本語のテキスト",
    "Mixed: café naïve — 🙂 ok, 中文 and English 👍🏽 done.",
    "Ångström, façade, jalapeño, Zürich, Øresund, ĳ, ß",
    "def f(x):\n\tif x:\n\t\treturn {'a': [1, 2]}  # ok\n\treturn None\n",
    "   leading spaces and trailing   ",
    "emoji in words: a🙂b🚀c 👩‍👩‍👧‍👦 family \U0001f9d1\u200d\U0001f52c",
    "한국어 텍스트와 العربية و עברית",
]


@pytest.fixture(scope="module")
def tokenizer(default_model_path: str) -> Any:
    """The default model's tokenizer: transformers and the model are hard dependencies, so a
    broken install fails here loudly instead of skipping."""
    import transformers

    return transformers.AutoTokenizer.from_pretrained(default_model_path)


def _encode(tok: Any, text: str) -> list[int]:
    return list(tok.encode(text, add_special_tokens=False))


def _chunkings(n: int) -> Iterator[list[int]]:
    """Chunk sizes covering `n` ids: one at a time, all at once, and seeded random splits."""
    yield [1] * n
    yield [n]
    for seed in range(4):
        rng = random.Random(seed)
        sizes, left = [], n
        while left:
            sizes.append(min(left, rng.randint(1, 4)))
            left -= sizes[-1]
        yield sizes


def _feed_all(state: DecodeState, ids: Sequence[int], sizes: Sequence[int],
              matched_stop: str | None = None) -> list[str]:
    """The deltas of feeding `ids` in chunks of `sizes`, the last one final (naming the stop the
    scheduler matched, if any)."""
    deltas, pos = [], 0
    for k, size in enumerate(sizes):
        last = k == len(sizes) - 1
        deltas.append(state.feed(ids[pos : pos + size], finished=last, matched_stop=matched_stop if last else None))
        pos += size
    if not sizes:
        deltas.append(state.feed([], finished=True))
    return deltas


def _byte_token(tok: Any, byte: int) -> int:
    """The id of the single-byte token for `byte` (GPT-2 bytes_to_unicode mapping)."""
    printable = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
    unprintable = [b for b in range(256) if b not in printable]
    char = chr(byte) if byte in printable else chr(256 + unprintable.index(byte))
    token_id = tok.convert_tokens_to_ids(char)
    assert tok.decode([token_id]) in (FFFD, bytes([byte]).decode("latin-1"))
    return int(token_id)


# ---------------------------------------------------------------- stop helpers


def test_find_stop_earliest_then_longest() -> None:
    assert find_stop("hello world", ["world"]) == (6, "world")
    assert find_stop("hello world", ["xyz"]) is None
    assert find_stop("abc\nUser: x\nUser:", ["\nUser:"]) == (3, "\nUser:")
    assert find_stop("a END b STOP", ["STOP", "END"]) == (2, "END")
    assert find_stop("xx\n\nUser", ["\n", "\n\n"]) == (2, "\n\n")
    assert find_stop("anything", ["", "thing"]) == (3, "thing")
    assert find_stop("", ["a"]) is None
    assert find_stop("abc", []) is None
    match = find_stop("你好世界", ["世界"])
    assert match is not None and match.pos == 2 and match.stop == "世界"


def test_partial_stop_suffix_len() -> None:
    assert partial_stop_suffix_len("hello\nUs", ["\nUser:"]) == 3
    assert partial_stop_suffix_len("hello\n", ["\nUser:"]) == 1
    assert partial_stop_suffix_len("hello", ["\nUser:"]) == 0
    # A complete stop string is not a *proper* prefix.
    assert partial_stop_suffix_len("ab", ["ab"]) == 0
    assert partial_stop_suffix_len("aba", ["ab"]) == 1
    assert partial_stop_suffix_len("xa", ["ab", "aab"]) == 1
    assert partial_stop_suffix_len("xaa", ["ab", "aab"]) == 2
    assert partial_stop_suffix_len("<en", ["<end>", "</s>"]) == 3
    assert partial_stop_suffix_len("", ["abc"]) == 0
    assert partial_stop_suffix_len("abc", []) == 0
    assert partial_stop_suffix_len("ab", ["abcdef"]) == 2
    assert max_stop_len(["a", "abcd"]) == 4 and max_stop_len([]) == 0


# ---------------------------------------------------------------- round trips


@pytest.mark.parametrize("text", TEXTS)
def test_deltas_concatenate_to_full_decode(tokenizer: Any, text: str) -> None:
    ids = _encode(tokenizer, text)
    expected = tokenizer.decode(ids, skip_special_tokens=True)
    assert expected == text
    prompt = _encode(tokenizer, "<|im_start|>assistant\nSure: ")
    for tail in ([], prompt):
        for sizes in _chunkings(len(ids)):
            state = DecodeState(tokenizer, tail)
            deltas, pos, emitted = [], 0, ""
            for k, size in enumerate(sizes):
                last = k == len(sizes) - 1
                delta = state.feed(ids[pos : pos + size], finished=last)
                pos += size
                assert FFFD not in delta
                emitted += delta
                # Append-only and prompt: everything stable so far is out, nothing more.
                stable = tokenizer.decode(ids[:pos]).rstrip(FFFD)
                assert emitted == (expected if last else stable)
                deltas.append(delta)
            assert "".join(deltas) == expected
            assert state.emitted_len == len(expected) and state.finished


def test_multibyte_characters_are_held_back(tokenizer: Any) -> None:
    ids = _encode(tokenizer, "🙂🚀")
    assert len(ids) > 2, "emoji should span several byte-level tokens"
    deltas = _feed_all(DecodeState(tokenizer), ids, [1] * len(ids))
    assert "" in deltas[:-1]
    assert [d for d in deltas if d] == ["🙂", "🚀"]


def test_invalid_bytes_show_as_replacement_at_finish(tokenizer: Any) -> None:
    e4, a = _byte_token(tokenizer, 0xE4), _encode(tokenizer, "A")
    ids = _encode(tokenizer, "hi") + [e4] + a + [e4]
    expected = tokenizer.decode(ids)
    assert expected == "hi" + FFFD + "A" + FFFD
    for sizes in _chunkings(len(ids)):
        deltas = _feed_all(DecodeState(tokenizer), ids, sizes)
        assert "".join(deltas) == expected
        assert not any(d.endswith(FFFD) for d in deltas[:-1])


def test_prompt_tail_ending_mid_character_is_dropped(tokenizer: Any) -> None:
    zh = _encode(tokenizer, "你好")
    assert len(zh) > 2
    state = DecodeState(tokenizer, _encode(tokenizer, "Q: ") + zh[:1])
    out = zh[1:] + _encode(tokenizer, " ok")
    assert "".join(_feed_all(state, out, [1] * len(out))) == tokenizer.decode(out)


def test_surround_keeps_sentencepiece_leading_space() -> None:
    class SentencePieceLike:
        """Metaspace-style decode: the leading space of the whole text is stripped."""

        pieces = ["▁Hi", ":", "▁world", "▁again", "!"]

        def decode(self, ids: list[int], **kwargs: Any) -> str:
            text = "".join(self.pieces[i] for i in ids).replace("▁", " ")
            return text[1:] if text.startswith(" ") else text

    state = DecodeState(SentencePieceLike(), [0, 1])
    assert [state.feed([i]) for i in (2, 3, 4)] == [" world", " again", "!"]


# ---------------------------------------------------------------- stop strings


STOP_CASES = [
    # (generated text, stops, expected text without trim)
    ("Sure, here it is.\nUser: next question", ["\nUser:"], "Sure, here it is."),
    ("The answer is 42<end> trailing words", ["<end>"], "The answer is 42"),
    ("a\nUs b\nUse c\nUser: d", ["\nUser:"], "a\nUs b\nUse c"),
    ("emoji 🙂🚀 then 你好世界 more", ["世界", "🚀 then"], "emoji 🙂"),
    ("two stops: <x> and <end>", ["<end>", "<x>"], "two stops: "),
]


@pytest.mark.parametrize("text,stops,expected", STOP_CASES)
@pytest.mark.parametrize("no_stop_trim", [False, True])
def test_stop_string_cut(
    tokenizer: Any, text: str, stops: list[str], expected: str, no_stop_trim: bool
) -> None:
    ids = _encode(tokenizer, text)
    match = find_stop(text, stops)
    assert match is not None and match.pos == len(expected)
    if no_stop_trim:
        expected = text[: match.pos + len(match.stop)]
    options = DecodeOptions(stop=tuple(stops), no_stop_trim=no_stop_trim)
    # The scheduler stops at the first token whose text contains a stop string, and names it.
    stop_at = next(k for k in range(1, len(ids) + 1) if find_stop(tokenizer.decode(ids[:k]), stops))
    generated = ids[:stop_at]
    for sizes in _chunkings(len(generated)):
        state = DecodeState(tokenizer, [], options)
        emitted = ""
        for delta in _feed_all(state, generated, sizes, match.stop):
            emitted += delta
            # Nothing emitted is later cut: every cumulative text prefixes the answer.
            assert expected.startswith(emitted)
        assert emitted == expected
        assert state.matched_stop == match.stop


def test_a_stop_string_the_scheduler_did_not_stop_at_is_text(tokenizer: Any) -> None:
    """Before min_new_tokens the scheduler lets a stop string pass: the detokenizer emits it
    (only the scheduler decides), and cuts at the occurrence the scheduler names at the end."""
    text = "one STOP two STOP three"
    ids = _encode(tokenizer, text)
    second = next(k for k in range(1, len(ids) + 1) if tokenizer.decode(ids[:k]).count("STOP") == 2)
    state = DecodeState(tokenizer, [], DecodeOptions(stop=("STOP",)))
    emitted = "".join(_feed_all(state, ids[:second], [1] * second, "STOP"))
    assert emitted == "one STOP two "


def test_unfinished_stop_prefix_is_held_then_released(tokenizer: Any) -> None:
    text = "result: 7\nUs"
    ids = _encode(tokenizer, text)
    state = DecodeState(tokenizer, [], DecodeOptions(stop=("\nUser:",)))
    emitted = "".join(state.feed([i]) for i in ids)
    assert emitted == "result: 7"
    assert state.feed([], finished=True) == "\nUs"
    assert state.matched_stop is None


def test_no_feed_after_stop_match(tokenizer: Any) -> None:
    state = DecodeState(tokenizer, [], DecodeOptions(stop=("STOP",)))
    assert state.feed(_encode(tokenizer, "go STOP"), finished=True, matched_stop="STOP") == "go "
    assert state.matched_stop == "STOP"
    with pytest.raises(ValueError, match="after the final"):
        state.feed(_encode(tokenizer, " more text"))


def test_the_scheduler_names_one_of_the_requests_stops_on_its_final_feed(tokenizer: Any) -> None:
    for finished, stop in ((False, "STOP"), (True, "OTHER")):
        with pytest.raises(ValueError, match="matched_stop"):
            DecodeState(tokenizer, [], DecodeOptions(stop=("STOP",))).feed([5], finished, matched_stop=stop)


# ---------------------------------------------------------------- special tokens


@pytest.mark.parametrize("skip", [True, False])
@pytest.mark.parametrize("spaces", [True, False])
def test_special_tokens(tokenizer: Any, skip: bool, spaces: bool) -> None:
    ids = (
        [IM_START] + _encode(tokenizer, "user\nHello 🙂") + [IM_END] + _encode(tokenizer, "\n")
        + [IM_START] + _encode(tokenizer, "assistant\n你好") + [IM_END]
    )  # fmt: skip
    expected = tokenizer.decode(
        ids, skip_special_tokens=skip, spaces_between_special_tokens=spaces
    )
    assert ("<|im_start|>" in expected) == (not skip)
    options = DecodeOptions(skip_special_tokens=skip, spaces_between_special_tokens=spaces)
    for sizes in _chunkings(len(ids)):
        deltas = _feed_all(DecodeState(tokenizer, [IM_START], options), ids, sizes)
        assert "".join(deltas) == expected


def test_options_are_passed_to_decode() -> None:
    seen: list[dict[str, Any]] = []

    class Recorder:
        def decode(self, ids: list[int], **kwargs: Any) -> str:
            seen.append(kwargs)
            return "x" * len(ids)

    options = DecodeOptions(skip_special_tokens=False, spaces_between_special_tokens=False)
    assert DecodeState(Recorder(), [], options).feed([1, 2], finished=True) == "xx"
    assert seen and all(
        kw == {"skip_special_tokens": False, "spaces_between_special_tokens": False}
        for kw in seen
    )


def test_trim_last_token(tokenizer: Any) -> None:
    hello = _encode(tokenizer, "Hello 🙂")
    options = DecodeOptions(skip_special_tokens=False)
    state = DecodeState(tokenizer, [], options)
    assert state.feed(hello[:2]) + state.feed(hello[2:] + [IM_END], True, trim_last_token=True) == (
        "Hello 🙂"
    )
    state = DecodeState(tokenizer, [], options)
    assert state.feed(hello + [IM_END], finished=True) == "Hello 🙂<|im_end|>"
    with pytest.raises(ValueError):
        DecodeState(tokenizer, [], options).feed(hello, finished=False, trim_last_token=True)
    with pytest.raises(ValueError):
        DecodeState(tokenizer, [], options).feed([], finished=True, trim_last_token=True)
    with pytest.raises(ValueError):
        state.feed(hello)


# ---------------------------------------------------------------- cost and table


class CountingTokenizer:
    """Wraps a tokenizer and records the length of every decoded id list."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.lengths: list[int] = []

    def decode(self, ids: list[int], **kwargs: Any) -> str:
        self.lengths.append(len(ids))
        return str(self.inner.decode(ids, **kwargs))


def test_decode_cost_bounded_by_window(tokenizer: Any) -> None:
    ids = _encode(tokenizer, " ".join(TEXTS) * 6)
    counting = CountingTokenizer(tokenizer)
    options = DecodeOptions(stop=("<never>",))
    state = DecodeState(counting, _encode(tokenizer, "prompt text here"), options)
    text = "".join(state.feed([i], finished=k == len(ids) - 1) for k, i in enumerate(ids))
    assert text == tokenizer.decode(ids)
    assert len(ids) > 500 and max(counting.lengths) <= 10
    assert len(state._unsent) <= len("<never>") - 1 and state._ids == []


def test_table_matches_single_states(tokenizer: Any) -> None:
    streams = {
        "a": (_encode(tokenizer, TEXTS[1] + TEXTS[2]), DecodeOptions()),
        "b": (_encode(tokenizer, STOP_CASES[0][0][: STOP_CASES[0][0].index("\nUser:")]),
              DecodeOptions(stop=("\nUser:",))),
        "c": ([IM_START] + _encode(tokenizer, "hi 🙂") + [IM_END], DecodeOptions(False)),
        "d": (_encode(tokenizer, TEXTS[0]), DecodeOptions()),
    }
    for tok in (tokenizer, CountingTokenizer(tokenizer)):  # with and without batch_decode
        table = DecodeStateTable(tok)
        singles = {rid: DecodeState(tokenizer, [5], opt) for rid, (_, opt) in streams.items()}
        out = {rid: "" for rid in streams}
        expected = {rid: "" for rid in streams}
        rng, pos = random.Random(7), {rid: 0 for rid in streams}
        while pos:
            rids = [r for r in pos if rng.random() < 0.8] or list(pos)
            chunks, fins = [], []
            for r in rids:
                n = rng.randint(1, 3)
                chunks.append(streams[r][0][pos[r] : pos[r] + n])
                pos[r] += n
                fins.append(pos[r] >= len(streams[r][0]))
            tails = [[5] for _ in rids]  # ignored once a rid is known
            opts = [streams[r][1] for r in rids]
            deltas = table.feed_batch(rids, chunks, fins, prompt_tails=tails, options=opts)
            for r, chunk, fin, delta in zip(rids, chunks, fins, deltas):
                out[r] += delta
                expected[r] += singles[r].feed(chunk, fin)
                if fin:
                    del pos[r]
                    assert r not in table
        assert out == expected
        assert len(table) == 0
        assert out["b"] == "Sure, here it is."


def test_table_capacity_and_discard(tokenizer: Any) -> None:
    table = DecodeStateTable(tokenizer, capacity=2)
    table.open("r1")
    table.open("r2")
    table.feed_batch(["r1"], [_encode(tokenizer, "x")], [False])  # r1 most recent
    table.open("r3")
    assert "r2" not in table and "r1" in table and "r3" in table and table.evictions == 1
    table.discard("r1")
    table.discard("missing")
    assert len(table) == 1 and table.get("r3") is not None
