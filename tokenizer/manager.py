"""The TokenizerManager: the main process's side of the runtime (SGLang's TokenizerManager).

It tokenizes and checks typed requests (`tokenizer/core/request.py`) against the model's limits,
sends them to the scheduler, and wakes each request's waiter when the detokenizer's BatchStrOut
arrives. One instance runs on one asyncio
loop (the HTTP server's, or the Engine's background loop); nothing here is thread-safe except
`fail_all_threadsafe`.

    PUSH  connect  "scheduler"   GenerateReq, AbortReq, FlushCacheReq, GetStateReq
    PULL  bind     "tokenizer"   BatchStrOut (detokenizer); FlushCacheOut, StateOut,
                                 SchedulerCrashed (scheduler or detokenizer)

Text prompts are encoded with the tokenizer's default `add_special_tokens=True`, as SGLang does.
A caller that applies a chat template itself passes the resulting ids, not its text, when the
template already contains the BOS token (the pipeline does so for chats).
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import logging
import time
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

from runtime.contracts.codec import TypeDispatcher
from runtime.contracts.config import ServerConfig
from runtime.contracts.errors import InvalidRequest, Overloaded, RuntimeCrashed
from runtime.contracts.ipc import AsyncPullSocket, IpcDir, PushSocket, new_context
from runtime.contracts.messages import (
    FAILED_KEY,
    AbortReq,
    BatchStrOut,
    FlushCacheOut,
    FlushCacheReq,
    GenerateReq,
    GetStateReq,
    SchedulerCrashed,
    StateOut,
)
from runtime.contracts.sampling import SamplingParams
from tokenizer.admission import PromptEncoder, check_admission, max_chars_per_token
from tokenizer.core.request import ChatInput, GenRequest, PromptRequest
from tokenizer.fanout import WARMUP_SUFFIX, Prepared
from tokenizer.labels import InternalRids, LabelIndex
from tokenizer.limits import (
    RequestLimits,
    check_grammar,
    check_prompt_chars,
    check_prompt_count,
    check_request,
    check_task,
    max_new_tokens,
)
from tokenizer.request_state import Group, ReqState, StateDelta, apply_output, take_delta

logger = logging.getLogger("radixserve.tokenizer")

CONTROL_TIMEOUT_S = 30.0
Taken = tuple[int, StateDelta]  # a choice's index and its news


class TokenizerManager:
    """Tokenize, send, and collect results of generation requests; see the module docstring.

    Args:
        scheduler_info: the scheduler's ChildReady info (vocab_size, context_length, ...).
        tokenizer: the served model's tokenizer when the caller has loaded it already.
    """

    def __init__(
        self, config: ServerConfig, ipc_path: str, scheduler_info: dict[str, Any], tokenizer: Any = None
    ) -> None:
        from runtime.support.tokenizer_load import load_tokenizer, tokenizer_source

        self.config = config
        self.scheduler_info = scheduler_info
        self.vocab_size: int = scheduler_info["vocab_size"]
        context_length = scheduler_info.get("context_length") or config.context_length
        assert context_length is not None, "the scheduler reports its context length"
        self.context_length: int = context_length
        # NOTE: the launcher loads it while the children start (`tokenizer.launch.launch_runtime_with`).
        self.tokenizer = tokenizer if tokenizer is not None else load_tokenizer(tokenizer_source(config))
        self.limits = RequestLimits(
            vocab_size=self.vocab_size, context_length=self.context_length,
            kv_total=scheduler_info.get("max_total_tokens"), max_n=config.max_n,
            max_top_logprobs=config.max_top_logprobs, max_chars_per_token=max_chars_per_token(self.tokenizer),
        )
        ipc = IpcDir(ipc_path)
        self._ctx = new_context()
        self._to_scheduler = PushSocket(self._ctx, ipc.endpoint("scheduler"), linger_ms=500)
        self._inbox = AsyncPullSocket(self._ctx, ipc.endpoint("tokenizer"), bind=True)
        self.rid_to_state: dict[str, ReqState] = {}  # by internal rid: only the server makes them
        self.labels = LabelIndex()  # the client rids (labels) of the live requests
        self._rids = InternalRids()
        self._reserved = 0  # admitted requests not registered yet (tokenizing, checking grammars)
        self.detokenizer_states = 0  # the detokenizer's live decode states, as of its last batch
        # Admission: requests (n>1 samples and their warm-ups each count) held at once.
        self.max_live = (scheduler_info.get("max_running_requests") or 0) + config.max_queued_requests
        self.on_reject: Callable[[str], None] | None = None
        """Called (on the loop) with the reason of each request refused for overload."""
        self.encoder = PromptEncoder(self.tokenizer)
        self.dead_reason: str | None = None
        self.on_dead: Callable[[str], None] | None = None
        """Called once (on the loop) when the runtime fails, e.g. to shut the tree down."""
        self.on_output: Callable[[ReqState, int, float], None] | None = None
        """Called (on the loop) after each output is folded into a request's state, with the
        completion tokens it had before and the arrival time; the HTTP server's metrics use it
        for token counters and TTFT / inter-token / end-to-end latencies. Must not raise."""
        self._pending: dict[int, asyncio.Future[Any]] = {}
        self._req_ids = itertools.count(1)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task[None] | None = None
        self._dispatch = TypeDispatcher({
            BatchStrOut: self._on_batch, FlushCacheOut: self._on_control,
            StateOut: self._on_control, SchedulerCrashed: self._on_crash,
        })

    @property
    def is_healthy(self) -> bool:
        return self.dead_reason is None

    async def start(self) -> None:
        """Start the receive loop on the running event loop."""
        self._loop = asyncio.get_running_loop()
        self._task = self._loop.create_task(self._recv_loop(), name="tokenizer-recv")

    async def close(self) -> None:
        """Stop the receive loop and close the sockets (requests still waiting are failed)."""
        self.fail_all("the runtime was shut down", level=logging.INFO)
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        self._to_scheduler.close()
        self._inbox.close()
        self._ctx.term()
        self.encoder.close()

    # ------------------------------------------------------------ generation

    async def submit(self, req: GenRequest) -> AsyncIterator[Taken]:
        """Check and tokenize `req` (its prompts are text or ids; chats are rendered by the
        pipeline first), send it, and return the iterator of its news: `(choice, StateDelta)`
        for every update while streaming, else once per choice when it finishes.

        Everything is checked before anything is sent, so `InvalidRequest` (named as `req.names`
        calls the fields) or `RuntimeCrashed` raises from this await, before iteration, and a
        bad prompt in a batch rejects the whole batch. Grammars are checked off the event loop
        (a guarded worker process): a slow or pathological schema delays only its own request.
        Closing the iterator early, or cancelling its consumer, aborts what is still running.
        """
        self._check_alive()
        field = req.prompts[0].field
        try:
            check_task(req.embed, self.scheduler_info)
            check_prompt_count(len(req.prompts), self.config.max_prompts_per_request, field)
            # NOTE: a request counts against the cap from the moment it is admitted, through the
            # awaits below, until _dispatch_all registers it: concurrent requests cannot all pass.
            reservation = self._admit(len(req.prompts), field)
        except InvalidRequest as exc:
            raise exc.renamed(req.names) from None
        try:
            ids = await self._encode(req)
            prepared = [self._prepare(req, p, p_ids) for p, p_ids in zip(req.prompts, ids)]
            reservation = self._admit(sum(len(p.all_rids()) for p in prepared), "n", replacing=reservation)
            for p in prepared:
                await check_grammar(p.req.sampling_params)
            self._check_alive()  # the runtime may have died while the grammar check ran
            self._check_labels(prepared)
        except InvalidRequest as exc:
            reservation.release()
            raise exc.renamed(req.names) from None
        except BaseException:
            reservation.release()
            raise
        return self._run(prepared, req.stream, reservation)

    async def _encode(self, req: GenRequest) -> list[list[int]]:
        """Each prompt's ids: given ids as they are, texts encoded (refused first when their
        length alone proves they cannot fit)."""
        texts = [p for p in req.prompts if isinstance(p.prompt, str)]
        for p in texts:
            assert isinstance(p.prompt, str)
            check_prompt_chars(p.field, len(p.prompt), self.limits)
        encoded = iter(await self.encoder.encode_texts([str(p.prompt) for p in texts]))
        out = []
        for p in req.prompts:
            assert not isinstance(p.prompt, ChatInput), "the pipeline renders chats before submitting"
            out.append(next(encoded) if isinstance(p.prompt, str) else list(p.prompt))
        return out

    def _admit(self, count: int, field: str, replacing: Reservation | None = None) -> Reservation:
        held = len(self.rid_to_state) + self._reserved - (replacing.count if replacing else 0)
        try:
            check_admission(held, count, self.max_live, field)
        except Overloaded:
            if self.on_reject is not None:
                self.on_reject("queue_full")
            raise
        if replacing is not None:
            replacing.release()
        return Reservation(self, count)

    def _check_labels(self, prepared: list[Prepared]) -> None:
        """Refuse client rids that a live request answers to, or that repeat within this one."""
        labels = [label for p in prepared for label in p.child_labels()]
        taken = self.labels.in_use(name for p in prepared for name in p.all_names())
        if taken is None and len(set(labels)) != len(labels):
            taken = next(label for label in labels if labels.count(label) > 1)
        if taken is not None:
            raise InvalidRequest.field("rid", f"{taken[:64]!r} is already in use")

    def _prepare(self, req: GenRequest, prompt: PromptRequest, ids: list[int]) -> Prepared:
        sampling = dict(prompt.sampling)
        given = sampling.get("max_new_tokens") is not None or not req.default_max_tokens
        params = SamplingParams.from_dict(sampling)
        params.max_new_tokens = max_new_tokens(params, given, ids, self.limits)
        check_request(prompt.field, ids, params, prompt.logprobs, self.limits)
        timeout = req.timeout or self.config.request_timeout
        if req.priority is not None and not self.config.enable_priority_scheduling:
            raise InvalidRequest.field("priority", "needs a server started with --enable-priority-scheduling")
        lp = prompt.logprobs
        pin_len, pin_ttl = prompt.pin.fields(len(ids)) if prompt.pin is not None else (0, 0.0)
        msg = GenerateReq(
            rid=self._rids.next(), input_ids=list(ids), deadline=None if timeout is None else time.time() + timeout,
            sampling_params=dataclasses.replace(params, n=1),
            return_logprob=lp.enabled, logprob_start_len=lp.start_len, top_logprobs_num=lp.top_n,
            stream=req.stream, extra_key=req.cache_namespace, priority=req.priority or 0,
            pin_prefix_len=pin_len, pin_ttl_s=pin_ttl, embed=req.embed,
        )
        return Prepared(msg, prompt.rid, req.group_rid, params.n, lp.with_text, req.owner)

    async def _run(self, prepared: list[Prepared], stream: bool, reservation: Reservation) -> AsyncIterator[Taken]:
        owned: list[ReqState] = []
        try:
            try:
                group, states = await self._dispatch_all(prepared, owned)
            finally:
                reservation.release()  # registered (or failed): rid_to_state counts them now
            async for i, delta in self._updates(group, states, stream):
                yield i, delta
        finally:
            # NOTE: the one place that aborts on cancellation, early close or error.
            self._abort_unfinished(owned)

    async def _dispatch_all(
        self, prepared: list[Prepared], owned: list[ReqState]
    ) -> tuple[Group, list[ReqState]]:
        """Register every state first, then send: warm-up copies (n>1), await them, children."""
        warm_group, group = Group(), Group()
        warm = [self._register(p.warmup_req(), warm_group, owned, False,
                               p.label + WARMUP_SUFFIX, p.all_names(), p.owner)
                for p in prepared if p.n > 1]
        children = [
            (p.req.rid, self._register(p.child_req(j, rid), group, owned, p.text_in_logprobs,
                                       label, p.names(label), p.owner))
            for p in prepared for j, (rid, label) in enumerate(zip(p.child_rids(), p.child_labels()))
        ]
        for state in warm:
            self._send_req(state)
        async for _ in self._updates(warm_group, warm, False):
            pass
        aborted = {s.rid.removesuffix(WARMUP_SUFFIX): s.finish_reason for s in warm
                   if s.finish_reason is not None and s.finish_reason.get("type") == "abort"}
        for parent, state in children:
            if state.finished:  # aborted by name before it was sent
                continue
            if parent in aborted:  # the parent was aborted during its warm-up: never send
                state.finish(aborted[parent], time.perf_counter())
                self._forget(state)
                group.mark(state.index)
            else:
                self._send_req(state)
        return group, [state for _, state in children]

    def _register(
        self, req: GenerateReq, group: Group, owned: list[ReqState], text_in_logprobs: bool,
        label: str, names: Sequence[str], owner: str,
    ) -> ReqState:
        assert req.rid not in self.rid_to_state, f"internal rid {req.rid} made twice"
        state = ReqState.for_request(req, group, text_in_logprobs, label, tuple(names))
        state.owner = owner
        self.rid_to_state[req.rid] = state
        self.labels.add(req.rid, state.names)
        owned.append(state)
        return state

    def _forget(self, state: ReqState) -> None:
        """Drop a registered state from both maps (finished, aborted or given up)."""
        if self.rid_to_state.get(state.rid) is state:
            del self.rid_to_state[state.rid]
            self.labels.remove(state.rid, state.names)

    def _send_req(self, state: ReqState) -> None:
        state.sent = True
        self._to_scheduler.send(state.req)

    async def _updates(self, group: Group, states: list[ReqState], stream: bool) -> AsyncIterator[Taken]:
        """(index, news) for every finished state, and for each update while streaming."""
        remaining = len(states)
        while remaining:
            for i in await group.take():
                state = states[i]
                if state.error is not None:
                    raise RuntimeCrashed(state.error)
                reason = state.finish_reason or {}
                if reason.get("param"):  # refused by the scheduler for a bad field (a grammar)
                    raise InvalidRequest.field(reason["param"], reason.get("message") or "invalid request")
                if state.finished:
                    remaining -= 1
                if state.finished or stream:
                    yield i, take_delta(state)

    def _abort_unfinished(self, owned: list[ReqState]) -> None:
        for state in owned:
            if self.rid_to_state.get(state.rid) is not state:
                continue
            self._forget(state)
            if state.sent and self.dead_reason is None:
                logger.info("aborting request %s (rid %r; its consumer went away)", state.rid, state.label)
                self._to_scheduler.send(AbortReq(rid=state.rid))

    # ------------------------------------------------------------ receiving

    async def _recv_loop(self) -> None:
        try:
            while True:
                self._dispatch(await self._inbox.recv())
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            logger.exception("the tokenizer manager's receive loop failed")
            self.fail_all(f"the tokenizer manager's receive loop failed: {exc!r}")

    def _on_batch(self, out: BatchStrOut) -> None:
        now = time.perf_counter()
        self.detokenizer_states = out.decode_states
        for i, rid in enumerate(out.rids):
            state = self.rid_to_state.get(rid)
            if state is None:  # aborted by its consumer, or failed
                continue
            before = state.completion_tokens
            apply_output(state, out, i, now, self._token_texts, self.encoder.off_loop)
            if self.on_output is not None:
                self.on_output(state, before, now)
            if state.finished:
                self._forget(state)
                self._abort_if_failed(state)
            if state.finished or state.stream:
                state.group.mark(state.index)

    def _abort_if_failed(self, state: ReqState) -> None:
        """A request the detokenizer failed may still run in the scheduler: stop it there."""
        reason = state.finish_reason
        if reason is not None and reason.pop(FAILED_KEY, False):
            self._to_scheduler.send(AbortReq(rid=state.rid))

    def _token_texts(self, ids: list[int]) -> list[str | None]:
        """Each id's own text, for logprob entries. NOTE: called on the receive loop for a few
        ids only; `apply_output` runs large lists on the encoder's worker thread (`offload`)."""
        return list(self.tokenizer.batch_decode([[t] for t in ids]))

    def _on_control(self, out: FlushCacheOut | StateOut) -> None:
        future = self._pending.pop(out.req_id, None)
        if future is not None and not future.done():
            future.set_result(out)

    def _on_crash(self, msg: SchedulerCrashed) -> None:
        lines = msg.traceback.strip().splitlines()
        last = lines[-1] if lines else "unknown error"
        self.fail_all(f"the {msg.process} process crashed: {last}")

    # ------------------------------------------------------------ failure

    def fail_all(self, message: str, level: int = logging.ERROR) -> None:
        """Fail every waiting request and control call with `RuntimeCrashed(message)`; later calls
        raise it at once. Only the first message is kept."""
        if self.dead_reason is not None:
            logger.info("runtime already failed; also: %s", message)
            return
        self.dead_reason = message
        logger.log(level, "%s; failing %d in-flight requests", message, len(self.rid_to_state))
        for state in self.rid_to_state.values():
            state.error = message
            state.group.mark(state.index)
        self.rid_to_state.clear()
        self.labels.clear()
        for future in self._pending.values():
            if not future.done():
                future.set_exception(RuntimeCrashed(message))
        if self.on_dead is not None:
            self.on_dead(message)

    def fail_all_threadsafe(self, message: str) -> None:
        """`fail_all` from another thread (the launcher's child watcher)."""
        if self._loop is None or self._loop.is_closed():
            self.dead_reason = self.dead_reason or message
            return
        try:
            self._loop.call_soon_threadsafe(self.fail_all, message)
        except RuntimeError:  # the loop closed meanwhile
            self.dead_reason = self.dead_reason or message

    def _check_alive(self) -> None:
        if self.dead_reason is not None:
            raise RuntimeCrashed(self.dead_reason)

    # ------------------------------------------------------------ control

    async def abort(self, rid: str, owner: str | None = None) -> None:
        """Abort the live requests that answer to the client rid `rid` (its own, its n>1 samples,
        a batch's prompts: tokenizer/labels.py) and belong to `owner` (None: any); each ends
        with finish_reason abort."""
        self._check_alive()
        for internal in self.labels.find(rid):
            state = self.rid_to_state[internal]
            if owner is None or state.owner == owner:
                self._abort_state(state)

    def _abort_state(self, state: ReqState) -> None:
        if state.sent:
            self._to_scheduler.send(AbortReq(rid=state.rid))
        else:  # not in the scheduler yet (an n>1 sample waiting for its warm-up): end it here
            state.finish({"type": "abort", "message": "aborted by request"}, time.perf_counter())
            self._forget(state)
            state.group.mark(state.index)

    def check_integrity(self) -> None:
        """The label index agrees with the live requests; nothing is reserved while idle."""
        self.labels.check_integrity({rid: state.names for rid, state in self.rid_to_state.items()})
        assert self._reserved >= 0, f"admission reservations went negative: {self._reserved}"

    async def abort_all(self, owner: str | None = None) -> None:
        """Abort every live request of `owner` (None: every request, the runtime's too)."""
        self._check_alive()
        if owner is None:
            self._to_scheduler.send(AbortReq(abort_all=True))
            return
        for state in [s for s in self.rid_to_state.values() if s.owner == owner]:
            self._abort_state(state)

    async def flush_cache(self) -> bool:
        """Drop the prefix cache; False if the scheduler refused (not idle) or did not answer."""
        try:
            out = await self._control(FlushCacheReq(next(self._req_ids)))
        except TimeoutError:
            logger.warning("flush_cache: no answer from the scheduler in %.0f s", CONTROL_TIMEOUT_S)
            return False
        return bool(out.success)

    async def get_state(self) -> dict[str, Any]:
        """The scheduler's internal state (StateOut.state)."""
        out = await self._control(GetStateReq(next(self._req_ids)))
        return dict(out.state)

    async def get_server_info(self) -> dict[str, Any]:
        """Config (no secrets), the scheduler's ready info, and its internal state."""
        info = {**self.config.public_dict(), **self.scheduler_info}
        info["internal_states"] = [await self.get_state()]
        info["tokenizer_state"] = self.held_counts()
        return info

    def held_counts(self) -> dict[str, int]:
        """How many requests each per-request map holds (all 0 once idle: leak checks read it)."""
        return {"in_flight": len(self.rid_to_state), "labels": len(self.labels), "reserved": self._reserved,
                "detokenizer_states": self.detokenizer_states}

    async def _control(self, msg: FlushCacheReq | GetStateReq) -> Any:
        self._check_alive()
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._pending[msg.req_id] = future
        try:
            self._to_scheduler.send(msg)
            return await asyncio.wait_for(future, CONTROL_TIMEOUT_S)
        finally:
            self._pending.pop(msg.req_id, None)

    def apply_chat_template(self, messages: list[dict[str, Any]],
                            tools: list[dict[str, Any]] | None = None, **template_vars: Any) -> str:
        """The prompt text of a chat with the tokenizer's own template, the generation prompt
        appended. Blocking: the HTTP routes call it off the event loop (`tokenizer.core.chat_template`).

        Raises:
            InvalidRequest: a name in `template_vars` is a parameter of the tokenizer's
                `apply_chat_template` (`chat_template`, `tokenize`, ...), not a template variable.
        """
        from tokenizer.core.chat_template import check_template_vars

        check_template_vars(template_vars)
        return self.tokenizer.apply_chat_template(
            messages, tools=tools, tokenize=False, add_generation_prompt=True, **template_vars)


class Reservation:
    """Admission slots held by a request between admission and registration; released once
    (explicitly, or when the request's iterator is dropped without ever being started)."""

    def __init__(self, manager: TokenizerManager, count: int) -> None:
        self.manager, self.count = manager, count
        manager._reserved += count

    def release(self) -> None:
        if self.count:
            self.manager._reserved -= self.count
            self.count = 0

    def __del__(self) -> None:
        self.release()
