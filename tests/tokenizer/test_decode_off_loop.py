"""Decoding off the HTTP event loop (issue 18, item 10): /detokenize, a completion's `echo` and
logprob texts run on the PromptEncoder's worker thread when long, each under a documented bound
(a 400 naming the field beyond it), with outputs unchanged.

The HTTP routes run in-process (aiohttp's test client) against a manager without a runtime: the
real `TokenizerManager.submit` checks and tokenizes with the default model's real tokenizer,
wrapped to record which thread decodes and, when asked, to hold a decode until the test lets it
go, and every prompt it would send answers "!" at once. The receive-loop path runs the real
`TokenizerManager._on_batch`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import threading
import types
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any, TypeVar

import pytest
from aiohttp.test_utils import TestClient, TestServer

from runtime.contracts.config import ServerConfig
from runtime.contracts.messages import BatchStrOut, GenerateReq
from runtime.contracts.sampling import SamplingParams
from tokenizer.admission import OFFLOAD_DECODE_IDS, PromptEncoder
from tokenizer.fanout import Prepared
from tokenizer.http_server import create_app
from tokenizer.labels import InternalRids, LabelIndex
from tokenizer.limits import RequestLimits
from tokenizer.manager import Reservation, Taken, TokenizerManager
from tokenizer.native.spec import MAX_DETOKENIZE_IDS
from tokenizer.request_state import Group, LogprobParts, ReqState, StateDelta, apply_output, take_delta
from tokenizer.server_state import ServerState

T = TypeVar("T")
CONTEXT = 2048
WORKER = "tokenize"  # PromptEncoder's thread_name_prefix


class Recording:
    """The real tokenizer, recording the thread of every decode; `gate` (when set) holds each
    decode until the test sets it. Encoding (the manager tokenizes text prompts) is not recorded."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.threads: list[str] = []
        self.gate: threading.Event | None = None

    def __len__(self) -> int:
        return len(self.tokenizer)

    def encode(self, text: str, **kwargs: Any) -> list[int]:
        return list(self.tokenizer.encode(text, **kwargs))  # not a decode: not recorded

    def decode(self, ids: list[int], **kwargs: Any) -> str:
        self._enter()
        return str(self.tokenizer.decode(ids, **kwargs))

    def batch_decode(self, seqs: list[list[int]], **kwargs: Any) -> list[str]:
        self._enter()
        return list(self.tokenizer.batch_decode(seqs, **kwargs))

    def _enter(self) -> None:
        self.threads.append(threading.current_thread().name)
        if self.gate is not None:
            assert self.gate.wait(30), "the test never released the decode"


class Manager(TokenizerManager):
    """A TokenizerManager without sockets or a runtime: `submit` checks and tokenizes as the real
    one does; each prompt it would send is recorded in `sent` and answers "!" at once."""

    def __init__(self, tokenizer: Recording, config: ServerConfig) -> None:  # NOTE: no sockets
        self.config, self.tokenizer = config, tokenizer  # type: ignore[assignment]
        self.encoder = PromptEncoder(tokenizer)
        self.vocab_size, self.context_length = len(tokenizer), CONTEXT
        self.scheduler_info = {"vocab_size": self.vocab_size}
        self.limits = RequestLimits(vocab_size=self.vocab_size, context_length=CONTEXT, kv_total=None,
                                    max_n=config.max_n, max_top_logprobs=config.max_top_logprobs)
        self.rid_to_state, self.labels, self._rids, self._reserved = {}, LabelIndex(), InternalRids(), 0
        self.max_live, self.dead_reason, self.on_output, self.on_reject = 64, None, None, None
        self.sent: list[Prepared] = []

    async def _run(self, prepared: list[Prepared], stream: bool, reservation: Reservation) -> AsyncIterator[Taken]:
        reservation.release()
        self.sent.extend(prepared)
        for i, p in enumerate(prepared):
            yield i, StateDelta("!", [1], None, None, None, len(p.req.input_ids), 1, 0, {"type": "length"},
                                p.label, 0.0)


@pytest.fixture(scope="module")
def hf_tokenizer(default_model_path: str) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(default_model_path)


@pytest.fixture
def recording(hf_tokenizer: Any) -> Iterator[Recording]:
    rec = Recording(hf_tokenizer)
    yield rec
    if rec.gate is not None:
        rec.gate.set()  # never leave a worker blocked


@pytest.fixture
def long_ids(hf_tokenizer: Any) -> list[int]:
    ids = list(hf_tokenizer.encode("The quick brown fox, jumps over the lazy dog. " * 120))
    assert OFFLOAD_DECODE_IDS <= len(ids) <= CONTEXT
    return ids


def _serve(manager: Manager, talk: Callable[[TestClient[Any, Any]], Awaitable[T]]) -> T:
    async def run() -> T:
        server = ServerState(manager.config)
        server.attach(manager)  # type: ignore[arg-type]
        try:
            async with TestClient(TestServer(create_app(server))) as client:
                return await talk(client)
        finally:
            manager.encoder.close()

    return asyncio.run(run())


async def _post(client: TestClient[Any, Any], path: str, body: Any) -> tuple[int, dict[str, Any]]:
    resp = await client.post(path, json=body)
    return resp.status, await resp.json()


# ---------------------------------------------------------------- /detokenize


@pytest.mark.parametrize("path", ["/detokenize", "/v1/detokenize"])
def test_a_long_detokenize_runs_on_the_worker_and_matches_the_direct_decode(
        recording: Recording, hf_tokenizer: Any, long_ids: list[int], path: str) -> None:
    short = long_ids[:3]

    async def talk(client: TestClient[Any, Any]) -> list[tuple[int, dict[str, Any]]]:
        return [await _post(client, path, {"tokens": long_ids}),
                await _post(client, path, {"tokens": long_ids, "skip_special_tokens": True}),
                await _post(client, path, {"tokens": short})]

    replies = _serve(Manager(recording, ServerConfig()), talk)
    assert replies == [(200, {"text": hf_tokenizer.decode(long_ids)}),
                       (200, {"text": hf_tokenizer.decode(long_ids, skip_special_tokens=True)}),
                       (200, {"text": hf_tokenizer.decode(short)})]
    assert [t.startswith(WORKER) for t in recording.threads] == [True, True, False]
    assert recording.threads[2] == "MainThread"  # a short list stays inline: the hop costs more


def test_the_event_loop_answers_while_a_long_detokenize_decodes(
        recording: Recording, hf_tokenizer: Any, long_ids: list[int]) -> None:
    recording.gate = threading.Event()

    async def talk(client: TestClient[Any, Any]) -> tuple[int, int, dict[str, Any]]:
        pending = asyncio.create_task(_post(client, "/detokenize", {"tokens": long_ids}))
        while not recording.threads:  # the decode has started on the worker and waits there
            await asyncio.sleep(0.01)
        models = await client.get("/v1/models")  # answered by the same event loop meanwhile
        assert not pending.done()
        assert recording.gate is not None
        recording.gate.set()
        status, body = await pending
        return models.status, status, body

    assert _serve(Manager(recording, ServerConfig()), talk) == (200, 200, {"text": hf_tokenizer.decode(long_ids)})
    assert recording.threads[0].startswith(WORKER)


def test_detokenize_bounds_are_400s_naming_tokens(recording: Recording) -> None:
    vocab = len(recording)
    bodies = [{"tokens": [0] * (MAX_DETOKENIZE_IDS + 1)}, {"tokens": [-1]}, {"tokens": [vocab]},
              {"tokens": [1, True]}, {"tokens": [1.0]}, {"tokens": "1 2"}]

    async def talk(client: TestClient[Any, Any]) -> list[tuple[int, dict[str, Any]]]:
        return [await _post(client, "/detokenize", body) for body in bodies]

    replies = _serve(Manager(recording, ServerConfig()), talk)
    params = ["tokens", "tokens[0]", "tokens", "tokens[1]", "tokens[0]", "tokens"]  # the bad field's full path
    assert [(status, body["error"]["param"]) for status, body in replies] == [(400, p) for p in params]
    assert all(body["error"]["message"].startswith(p + ":") for p, (_, body) in zip(params, replies))
    assert f"0 to {MAX_DETOKENIZE_IDS} items" in replies[0][1]["error"]["message"]
    assert recording.threads == []  # nothing was decoded
    assert MAX_DETOKENIZE_IDS == 131072  # the documented bound (token_routes, docs/reliability.md)


# ---------------------------------------------------------------- /v1/completions echo


def _completion(prompt: Any, **extra: Any) -> dict[str, Any]:
    return {"model": "m", "prompt": prompt, "max_tokens": 1, "echo": True, **extra}


def test_echo_of_a_long_id_prompt_decodes_on_the_worker(
        recording: Recording, hf_tokenizer: Any, long_ids: list[int]) -> None:
    async def talk(client: TestClient[Any, Any]) -> tuple[int, dict[str, Any]]:
        return await _post(client, "/v1/completions", _completion(long_ids))

    status, body = _serve(Manager(recording, ServerConfig()), talk)
    assert status == 200 and body["choices"][0]["text"] == hf_tokenizer.decode(long_ids) + "!"
    assert len(recording.threads) == 1 and recording.threads[0].startswith(WORKER)


def test_echo_of_short_and_text_prompts_is_unchanged(recording: Recording, hf_tokenizer: Any) -> None:
    async def talk(client: TestClient[Any, Any]) -> list[tuple[int, dict[str, Any]]]:
        return [await _post(client, "/v1/completions", _completion([5, 6, 7])),
                await _post(client, "/v1/completions", _completion("Once upon"))]

    (_, ids_body), (_, text_body) = _serve(Manager(recording, ServerConfig()), talk)
    assert ids_body["choices"][0]["text"] == hf_tokenizer.decode([5, 6, 7]) + "!"
    assert text_body["choices"][0]["text"] == "Once upon!"
    assert recording.threads == ["MainThread"]  # a short id prompt decodes inline; text is not decoded


@pytest.mark.parametrize("prompt, param, words", [
    ([1] * (CONTEXT + 1), "prompt", "context length"),
    ([5, -1], "prompt[1]", "greater than or equal to 0"),  # the tokenizer cannot even decode it (it was a 500)
    ([5, 10**9], "prompt", "outside"),
    ([[5]] * 5, "prompt", "at most 4"),
], ids=["longer than the context", "negative id", "id past the vocabulary", "more prompts than the cap"])
def test_echo_bounds_are_400s_naming_prompt(recording: Recording, prompt: Any, param: str, words: str) -> None:
    manager = Manager(recording, ServerConfig(max_prompts_per_request=4))

    async def talk(client: TestClient[Any, Any]) -> tuple[int, dict[str, Any]]:
        return await _post(client, "/v1/completions", _completion(prompt))

    status, body = _serve(manager, talk)
    assert status == 400 and body["error"]["param"] == param, body
    assert body["error"]["message"].startswith(param + ":") and words in body["error"]["message"]
    assert recording.threads == [] and manager.sent == []  # nothing decoded, nothing generated


# ---------------------------------------------------------------- logprob texts on the receive loop


def _message(rid: str, prompt: list[int], new: list[int], k: int, first: bool,
             finished: dict[str, Any] | None = None) -> BatchStrOut:
    """One output of `rid`: its input logprobs (with top-k) when `first`, `new` output ids."""
    def tops(ids: list[int]) -> list[Any]:
        return [[[(t + j) % 1000 for j in range(k)], [-0.5 - j for j in range(k)]] for t in ids]

    return BatchStrOut(
        rids=[rid], finished_reasons=[finished], texts=["x" * len(new)], output_ids=[new],
        prompt_tokens=[len(prompt)], completion_tokens=[len(new)], cached_tokens=[0],
        output_logprobs=[[-0.25] * len(new)], output_top_logprobs=[tops(new)],
        input_logprobs=[[None] + [-1.0] * (len(prompt) - 1) if first else None],
        input_top_logprobs=[[None] + tops(prompt[1:]) if first else None],
        input_ids_for_logprobs=[prompt if first else None],
    )


def _receiver(tokenizer: Recording) -> TokenizerManager:
    tm = object.__new__(TokenizerManager)  # only what _on_batch reads
    tm.tokenizer, tm.encoder = tokenizer, PromptEncoder(tokenizer)
    tm.rid_to_state, tm.labels, tm.on_output = {}, LabelIndex(), None
    return tm


def _register(tm: TokenizerManager, rid: str, prompt: list[int], k: int) -> ReqState:
    req = GenerateReq(rid, prompt, SamplingParams(), return_logprob=True, logprob_start_len=0,
                      top_logprobs_num=k, stream=True)
    state = ReqState.for_request(req, Group(), text_in_logprobs=True)
    tm.rid_to_state[rid] = state
    tm.labels.add(rid, state.names)
    return state


def _news(state: ReqState) -> StateDelta:
    """What the state's consumer takes (its latency aside)."""
    return dataclasses.replace(take_delta(state), latency=0.0)


def test_input_top_logprob_texts_are_built_off_the_receive_loop_in_order(
        recording: Recording, long_ids: list[int]) -> None:
    k = 3
    prompt = long_ids[:200]  # 200 positions x (1 + 3) entries: past OFFLOAD_DECODE_IDS
    messages = [_message("r", prompt, [11, 12], k, first=True),
                _message("r", prompt, [13], k, first=False, finished={"type": "length"})]

    async def main() -> tuple[StateDelta, list[int]]:
        tm = _receiver(recording)
        state = _register(tm, "r", prompt, k)
        recording.gate = threading.Event()
        try:
            tm._on_batch(messages[0])  # returns while the worker's decode is held: no blocking
            tm._on_batch(messages[1])  # a small fold, queued behind the first one
            assert state.finished and "".join(state.pieces) == "xxx"  # everything but the logprobs is in
            take = asyncio.create_task(state.group.take())
            while not recording.threads:
                await asyncio.sleep(0.01)
            await asyncio.sleep(0.05)
            assert not take.done(), "the consumer woke before the logprobs were folded"
            recording.gate.set()
            news = await asyncio.wait_for(take, 30)
            return _news(state), news
        finally:
            recording.gate.set()
            tm.encoder.close()

    meta, news = asyncio.run(main())
    assert news == [0]
    assert recording.threads and all(t.startswith(WORKER) for t in recording.threads)
    direct = ReqState.for_request(GenerateReq("r", prompt, SamplingParams(), return_logprob=True,
                                              logprob_start_len=0, top_logprobs_num=k, stream=True),
                                  Group(), text_in_logprobs=True)
    holder = types.SimpleNamespace(tokenizer=recording)
    for message in messages:  # the direct fold on the calling thread, as before
        apply_output(direct, message, 0, 0.0, lambda ids: TokenizerManager._token_texts(holder, ids))  # type: ignore[arg-type]
    assert meta == _news(direct)
    assert meta.input is not None and meta.input[1] is not None
    assert meta.input[1][1] is not None
    assert meta.input[1][1][0][2] == recording.tokenizer.decode([prompt[1] % 1000])
    assert meta.logprobs is not None and [e[1] for e in meta.logprobs] == [11, 12, 13]


def test_small_logprob_folds_stay_on_the_loop(recording: Recording) -> None:
    async def main() -> StateDelta:
        tm = _receiver(recording)
        state = _register(tm, "s", [5, 6, 7], 2)
        try:
            tm._on_batch(_message("s", [5, 6, 7], [8], 2, first=True, finished={"type": "length"}))
            assert await state.group.take() == [0]
            return _news(state)
        finally:
            tm.encoder.close()

    meta = asyncio.run(main())
    assert recording.threads and set(recording.threads) == {"MainThread"}
    assert meta.logprobs == [[-0.25, 8, recording.tokenizer.decode([8])]]


def test_a_fold_that_fails_fails_its_request(recording: Recording) -> None:
    async def broken(job: Callable[[], LogprobParts]) -> LogprobParts:
        raise RuntimeError("boom")

    async def main() -> tuple[list[int], str | None]:
        req = GenerateReq("f", [1] * 600, SamplingParams(), return_logprob=True, logprob_start_len=0)
        state = ReqState.for_request(req, Group(), text_in_logprobs=True)
        apply_output(state, _message("f", [1] * 600, [2], 0, first=True), 0, 0.0,
                     lambda ids: [None] * len(ids), broken)
        return await asyncio.wait_for(state.group.take(), 30), state.error

    news, error = asyncio.run(main())
    assert news == [0] and error is not None and "boom" in error
