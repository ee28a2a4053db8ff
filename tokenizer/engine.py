"""The in-process Engine: the runtime without HTTP, with a synchronous API.

    with Engine(dtype="float32") as engine:
        out = engine.generate("The capital of France is", {"max_new_tokens": 8, "temperature": 0})
        for chunk in engine.generate("Hi", stream=True):
            print(chunk["text"])
        vectors = engine.encode(["a text", "another"])     # [{"embedding": [...], "meta_info": ...}]

It launches the scheduler and detokenizer processes and drives a `TokenizerManager` on its own
event loop in a background thread; every public method hands a coroutine to that loop and waits.
There is one code path with the HTTP server: results, errors (`InvalidRequest`,
`RuntimeCrashed`) and aborts are the TokenizerManager's.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import functools
import threading
import uuid
from collections.abc import AsyncIterator, Coroutine, Iterator
from typing import Any, TypeVar

from runtime.contracts.config import ServerConfig, config_from_kwargs
from runtime.contracts.errors import RuntimeCrashed
from tokenizer.core.embed import EmbedJob, embed_inputs
from tokenizer.core.events import Update
from tokenizer.core.pipeline import generate
from tokenizer.launch import ChildTarget, Runtime, launch_runtime_with
from tokenizer.manager import TokenizerManager
from tokenizer.native.generate import NativeAnswer, parse_generate

GenerateOutput = dict[str, Any] | list[dict[str, Any]]

_T = TypeVar("_T")
_DONE = object()
CLOSE_TIMEOUT_S = 10.0


class Engine:
    """A running radixserve runtime in this process.

    Args:
        model_path: Hugging Face model folder (default: the embedded SmolLM2-135M-Instruct).
        **config_kwargs: any `ServerConfig` field, e.g. `dtype="float32", page_size=16`.
    """

    def __init__(self, model_path: str | None = None, **config_kwargs: Any) -> None:
        self._start(config_from_kwargs(model_path, **config_kwargs), None)

    @classmethod
    def from_config(
        cls, config: ServerConfig, *, scheduler_target: ChildTarget | None = None
    ) -> Engine:
        """An Engine for an existing config; `scheduler_target` replaces the scheduler process
        entry (tests use a fake scheduler)."""
        engine = cls.__new__(cls)
        engine._start(config, scheduler_target)
        return engine

    def _start(self, config: ServerConfig, scheduler_target: ChildTarget | None) -> None:
        from runtime.execution.resolve import resolve_config
        from runtime.support.tokenizer_load import load_tokenizer, tokenizer_source

        self.config = resolve_config(config)
        self._closed = False
        # The tokenizer loads here while the children load.
        load = functools.partial(load_tokenizer, tokenizer_source(self.config))
        self._runtime: Runtime
        self._runtime, tokenizer = launch_runtime_with(self.config, load, scheduler_target)
        self.loop = _new_event_loop()
        self._thread = threading.Thread(
            target=self.loop.run_forever, name="radixserve-engine", daemon=True
        )
        self._thread.start()
        try:
            self.tokenizer_manager: TokenizerManager = self._call(self._start_manager(tokenizer))
        except BaseException:
            self._stop_loop()
            self._runtime.shutdown()
            raise
        self._runtime.watch(self.tokenizer_manager.fail_all_threadsafe)
        atexit.register(self.shutdown)

    async def _start_manager(self, tokenizer: Any) -> TokenizerManager:
        tm = TokenizerManager(self.config, self._runtime.ipc_path, self._runtime.scheduler_info, tokenizer)
        tm.on_dead = self._on_dead
        await tm.start()
        return tm

    def _on_dead(self, message: str) -> None:
        # NOTE: runs on the loop; shutting the children down blocks, so it gets its own thread.
        threading.Thread(target=self._runtime.shutdown, name="runtime-stop", daemon=True).start()

    @property
    def scheduler_info(self) -> dict[str, Any]:
        return dict(self._runtime.scheduler_info)

    # ------------------------------------------------------------ generation

    def generate(
        self,
        prompt: str | list[str] | None = None,
        sampling_params: dict[str, Any] | list[dict[str, Any]] | None = None,
        input_ids: list[int] | list[list[int]] | None = None,
        return_logprob: bool | list[bool] = False,
        logprob_start_len: int | list[int] | None = None,
        top_logprobs_num: int | list[int] = 0,
        return_text_in_logprobs: bool = False,
        stream: bool = False,
        rid: str | list[str] | None = None,
        priority: int | None = None,
        extra_key: str | None = None,
    ) -> GenerateOutput | Iterator[dict[str, Any]]:
        """Generate, with SGLang's /generate shapes (`tokenizer/native/generate.py`).

        Returns a result dict (one prompt), a list of them (a batch or n>1), or, with
        `stream=True`, an iterator of cumulative chunks; leaving that iterator early (break,
        close, garbage collection) aborts the request.
        Raises:
            InvalidRequest: bad input, raised here before anything is sent.
            RuntimeCrashed: the runtime died or was shut down.
        """
        body = {
            "text": prompt, "input_ids": input_ids, "sampling_params": sampling_params,
            "rid": rid, "return_logprob": return_logprob, "logprob_start_len": logprob_start_len,
            "top_logprobs_num": top_logprobs_num,
            "return_text_in_logprobs": return_text_in_logprobs,
            "stream": stream, "priority": priority, "extra_key": extra_key,
        }
        results = self._call(self._open(body))
        if stream:
            return self._iterate(results)
        return self._call(_first(results))

    async def _open(self, body: dict[str, Any]) -> AsyncIterator[GenerateOutput]:
        # NOTE: on the loop thread: the tokenizer and the request table belong to it.
        req = parse_generate(body)
        updates = await generate(self.tokenizer_manager, req)
        return _outputs(updates, NativeAnswer(req))

    def _iterate(self, results: AsyncIterator[GenerateOutput]) -> Iterator[dict[str, Any]]:
        try:
            while True:
                chunk = self._call(_next(results))
                if chunk is _DONE:
                    return
                yield chunk
        finally:
            if not self._closed:
                self._call(_aclose(results))

    def encode(self, prompt: str | list[str] | list[int] | list[list[int]],
               dimensions: int | None = None) -> list[dict[str, Any]]:
        """Embed a text, texts, ids or lists of ids (SGLang's `Engine.encode`): per input
        `{"embedding": [...], "meta_info": {"prompt_tokens", "cached_tokens"}}`, as /v1/embeddings
        computes them."""
        single = isinstance(prompt, str) or (bool(prompt) and isinstance(prompt[0], int))
        inputs: list[str | list[int]] = [prompt] if single else list(prompt)  # type: ignore[list-item, arg-type]
        fields = ["prompt"] if single else [f"prompt[{i}]" for i in range(len(inputs))]
        job = EmbedJob(inputs, fields, "prompt", rid=f"encode-{uuid.uuid4().hex}", dimensions=dimensions)
        results = self._call(embed_inputs(self.tokenizer_manager, job))
        return [{"embedding": r.vector, "meta_info": {"prompt_tokens": r.prompt_tokens,
                                                      "cached_tokens": r.cached_tokens}} for r in results]

    # ------------------------------------------------------------ control

    def abort(self, rid: str) -> None:
        """Abort a request (and its n>1 children) by rid; it finishes with finish_reason abort."""
        self._call(self.tokenizer_manager.abort(rid))

    def abort_all(self) -> None:
        self._call(self.tokenizer_manager.abort_all())

    def flush_cache(self) -> bool:
        """Drop the prefix cache; False when the scheduler is not idle."""
        return self._call(self.tokenizer_manager.flush_cache())

    def get_state(self) -> dict[str, Any]:
        """The scheduler's internal state."""
        return self._call(self.tokenizer_manager.get_state())

    def get_server_info(self) -> dict[str, Any]:
        """Config (without secrets), the scheduler's info and its internal state."""
        return self._call(self.tokenizer_manager.get_server_info())

    @property
    def is_healthy(self) -> bool:
        return not self._closed and self.tokenizer_manager.is_healthy

    def shutdown(self) -> None:
        """Stop the child processes and the event loop; idempotent. Waiting calls raise
        RuntimeCrashed."""
        if self._closed:
            return
        self._closed = True
        atexit.unregister(self.shutdown)
        self._runtime.shutdown()
        try:
            asyncio.run_coroutine_threadsafe(self._close_loop(), self.loop).result(CLOSE_TIMEOUT_S)
        finally:
            self._stop_loop()

    async def _close_loop(self) -> None:
        await self.tokenizer_manager.close()
        others = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for task in others:
            task.cancel()
        await asyncio.gather(*others, return_exceptions=True)

    def _stop_loop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=CLOSE_TIMEOUT_S)
        if not self._thread.is_alive():
            self.loop.close()

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    def _call(self, coro: Coroutine[Any, Any, _T]) -> _T:
        """Run `coro` on the engine's loop and wait; interrupting the wait cancels it."""
        if self._closed:
            coro.close()
            raise RuntimeCrashed("the engine was shut down")
        future = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            return future.result()
        except concurrent.futures.CancelledError:
            raise RuntimeCrashed("the engine was shut down") from None
        except BaseException:
            future.cancel()  # e.g. KeyboardInterrupt: the coroutine's cleanup aborts the request
            raise


async def _outputs(updates: AsyncIterator[Update], answer: NativeAnswer) -> AsyncIterator[GenerateOutput]:
    """SGLang's shapes: a stream's chunks, or the one final result."""
    try:
        async for update in updates:
            for chunk in answer.update(update):
                if answer.stream:
                    yield chunk
        if not answer.stream:
            yield answer.final()
    finally:
        await _aclose(updates)


async def _first(results: AsyncIterator[GenerateOutput]) -> GenerateOutput:
    try:
        return await results.__anext__()
    finally:
        await _aclose(results)


async def _next(results: AsyncIterator[GenerateOutput]) -> Any:
    try:
        return await results.__anext__()
    except StopAsyncIteration:
        return _DONE


async def _aclose(results: AsyncIterator[Any]) -> None:
    aclose = getattr(results, "aclose", None)
    if aclose is not None:
        await aclose()


def _new_event_loop() -> asyncio.AbstractEventLoop:
    try:
        import uvloop
    except ImportError:
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()
