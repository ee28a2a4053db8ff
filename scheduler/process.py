"""The scheduler process: load the model, wire the sockets, report ready, run the loop.

Sockets (docs/architecture.md, "The processes"; the receiving side binds):
    PULL  bind     "scheduler"     GenerateReq, AbortReq, FlushCacheReq, GetStateReq, ShutdownReq
    PUSH  connect  "detokenizer"   one BatchTokenOut per forward step
    PUSH  connect  "tokenizer"     FlushCacheOut, StateOut, SchedulerCrashed
"""

from __future__ import annotations

import logging
import os
import sys
import traceback
from multiprocessing.connection import Connection
from typing import TYPE_CHECKING, Any

from runtime.contracts.codec import encode
from runtime.contracts.config import ServerConfig, read_model_json
from runtime.contracts.encoder_config import is_encoder
from runtime.contracts.ipc import IpcDir, PullSocket, PushSocket, new_context
from runtime.contracts.messages import BatchTokenOut, ChildReady, SchedulerCrashed
from runtime.contracts.pooling import read_pooling
from scheduler.watchdog import Watchdog

if TYPE_CHECKING:
    from scheduler.interfaces import SchedulerIO
    from scheduler.scheduler import Scheduler

logger = logging.getLogger("radixserve.scheduler")
IDLE_POLL_MS = 200  # how long an idle scheduler blocks on its socket before looking around


class SocketIO:
    """The scheduler's three sockets behind the `SchedulerIO` protocol."""

    def __init__(self, ipc_path: str) -> None:
        ipc = IpcDir(ipc_path)
        self.ctx = new_context()
        self.inbox = PullSocket(self.ctx, ipc.endpoint("scheduler"), bind=True)
        self.to_detokenizer = PushSocket(self.ctx, ipc.endpoint("detokenizer"))
        self.to_tokenizer = PushSocket(self.ctx, ipc.endpoint("tokenizer"))

    def recv(self, block: bool) -> list[Any]:
        if block:
            first = self.inbox.recv(timeout_ms=IDLE_POLL_MS)
            return [] if first is None else [first, *self.inbox.drain()]
        return self.inbox.drain()

    def send_tokens(self, msg: BatchTokenOut) -> None:
        self.to_detokenizer.send(msg)

    def send_control(self, msg: Any) -> None:
        self.to_tokenizer.send(msg)

    def close(self) -> None:
        for sock in (self.inbox, self.to_detokenizer, self.to_tokenizer):
            sock.close()
        self.ctx.term()


CRASH_REPORT_TIMEOUT_MS = 1000


def start_watchdog(config: ServerConfig, ipc_path: str, scheduler: Scheduler) -> Watchdog | None:
    """The watchdog of a running scheduler; its report goes out on a socket of its own (ZMQ
    sockets are not thread-safe, and the loop's may be mid-send in the stuck thread)."""
    if not config.watchdog_timeout:
        return None

    def report(message: str) -> None:
        ctx = new_context()
        sock = PushSocket(ctx, IpcDir(ipc_path).endpoint("tokenizer"), linger_ms=1000)
        sock.send(SchedulerCrashed("scheduler", message))
        sock.close()
        ctx.term()

    return Watchdog(config.watchdog_timeout, lambda: scheduler.progress_at, report).start()


def eos_token_ids(model_path: str, tokenizer: Any, config_eos: tuple[int, ...]) -> frozenset[int]:
    """EOS ids from config.json, generation_config.json and the tokenizer, together."""
    gen_eos = read_model_json(model_path, "generation_config.json").get("eos_token_id")
    ids = set(config_eos)
    ids.update(gen_eos if isinstance(gen_eos, list) else [] if gen_eos is None else [gen_eos])
    if tokenizer.eos_token_id is not None:
        ids.add(tokenizer.eos_token_id)
    return frozenset(ids)


def build_scheduler(config: ServerConfig, io: SchedulerIO, ipc_path: str | None = None) -> Scheduler:
    """Load the model and tokenizer and return a ready Scheduler (also used in-process by tests).

    With tp_size > 1 this is rank 0: it joins the group through `ipc_path`'s rendezvous file,
    loads its part of the model, and leads the other ranks' forwards from the warm-up on.
    """
    from runtime.execution.model_runner import ModelRunner
    from runtime.execution.model_setup import load_model_for_serving
    from runtime.support.tokenizer_load import load_tokenizer, tokenizer_source
    from scheduler.grammar import GrammarBackend
    from scheduler.grammar_queue import GrammarQueue
    from scheduler.scheduler import Scheduler

    if config.tp_size > 1:
        from runtime.execution.tp_worker import load_rank

        assert ipc_path is not None, "tensor parallelism needs the launch's IPC directory"
        loaded = load_rank(config, ipc_path, 0)
    else:
        loaded = load_model_for_serving(config)
    tokenizer = load_tokenizer(tokenizer_source(config))
    eos = eos_token_ids(config.model_path or "", tokenizer, loaded.model_config.eos_token_ids)

    def decode(ids: list[int], skip_special_tokens: bool) -> str:
        text: str = tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)
        return text

    runner = ModelRunner(loaded)
    if loaded.tp is not None:
        runner.lead_tensor_parallel()
    runner.warmup()
    if not loaded.config.disable_cuda_graph and loaded.config.cuda_graph_max_bs:
        runner.init_cuda_graphs(loaded.config.cuda_graph_max_bs)

    def make_grammar_backend() -> GrammarBackend:
        return GrammarBackend(tokenizer, loaded.model_config.vocab_size, sorted(eos))

    return Scheduler(loaded.config, runner, decode, eos, io, GrammarQueue(make_grammar_backend),
                     overlap=not config.disable_overlap_schedule)


def run_scheduler_process(config: ServerConfig, ipc_path: str, ready_conn: Connection) -> None:
    from runtime.support.procutil import configure_child, watch_parent

    configure_child(config, "scheduler")
    watch_parent()
    io = SocketIO(ipc_path)
    try:
        if is_encoder(read_model_json(config.model_path or "", "config.json")):
            _serve_encoder(config, io, ready_conn)
        else:
            _serve_decoder(config, io, ipc_path, ready_conn)
    except Exception:
        tb = traceback.format_exc()
        logger.error("scheduler crashed:\n%s", tb)
        _report_crash(io, tb)
        io.close()
        _exit_now(1)
    io.close()
    # Sockets closed (ZMQ has flushed what was sent): the interpreter's own teardown of torch and
    # its threads takes ~2 s and holds nothing we need, so skip it as the crash path does.
    _exit_now(0)


def embedding_info(config: ServerConfig, encoder: bool) -> dict[str, Any]:
    """What the main process needs to answer embeddings: the vector size and the pooling."""
    path = config.model_path or ""
    try:
        pooling: dict[str, Any] = read_pooling(path, encoder).as_dict()
    except ValueError as exc:  # a decoder still generates; its embeddings are refused (limits.check_task)
        if encoder:
            raise
        pooling = {"mode": str(exc), "normalize": False}
    return {"hidden_size": read_model_json(path, "config.json").get("hidden_size"), "encoder": encoder,
            "pooling": pooling}


def _serve_decoder(config: ServerConfig, io: SocketIO, ipc_path: str, ready_conn: Connection) -> None:
    scheduler = build_scheduler(config, io, ipc_path)
    info = {
        "max_total_tokens": scheduler.ledger.cache.total,
        "max_running_requests": scheduler.max_running,
        "context_length": scheduler.context_len,
        "vocab_size": scheduler.runner.vocab_size,
        "eos_token_ids": sorted(scheduler.eos_ids),
        "engines": scheduler.runner.engines,
        **embedding_info(config, False),
    }
    ready_conn.send_bytes(encode(ChildReady("scheduler", info)))
    watchdog = start_watchdog(config, ipc_path, scheduler)
    scheduler.event_loop()
    if watchdog is not None:
        watchdog.stop()
    scheduler.runner.close()


def _serve_encoder(config: ServerConfig, io: SocketIO, ready_conn: Connection) -> None:
    """An encoder's loop (scheduler/encoder_loop.py): no KV pool, one forward per batch."""
    from runtime.execution.encoder_runner import EncoderRunner
    from scheduler.encoder_loop import EncoderScheduler

    runner = EncoderRunner.load(config)
    assert config.context_length is not None and config.max_running_requests is not None
    runner.embed([[0, 1]])  # warm-up: the first request does not pay for oneDNN's set-up
    info = {"max_total_tokens": None, "max_running_requests": config.max_running_requests,
            "context_length": config.context_length, "vocab_size": runner.model.config.vocab_size,
            "eos_token_ids": [], "engines": [], **embedding_info(config, True)}
    ready_conn.send_bytes(encode(ChildReady("scheduler", info)))
    EncoderScheduler(runner, io, config.context_length).event_loop()


def _report_crash(io: SocketIO, tb: str) -> None:
    """Tell the main process, waiting at most CRASH_REPORT_TIMEOUT_MS: it may already be shutting
    the tree down (another child died first) and read nothing, and a send would wait its full
    timeout while this process should be gone."""
    io.to_tokenizer.send_timeout_ms = CRASH_REPORT_TIMEOUT_MS
    try:
        io.send_control(SchedulerCrashed("scheduler", tb))
    except ConnectionError:
        logger.warning("the crash could not be reported: the main process is not reading")


def _exit_now(code: int) -> None:
    """Exit at once, after a clean stop or with the crash reported. NOTE: a normal interpreter
    exit can block on what a failure left behind (a torch.distributed group whose peer was
    killed mid-collective, the tensor-parallel channel's sockets), and a rank must not outlive
    its peer."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
