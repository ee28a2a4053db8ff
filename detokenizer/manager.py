"""The detokenizer process: BatchTokenOut (token id deltas) in, BatchStrOut (text deltas) out.

Sockets (docs/architecture.md, "The processes"; the receiving side binds):
    PULL  bind     "detokenizer"   BatchTokenOut from the scheduler, ShutdownReq from the launcher
    PUSH  connect  "tokenizer"     BatchStrOut, and SchedulerCrashed if this process dies

One BatchStrOut per BatchTokenOut, decoded through one `DecodeStateTable.feed_batch` call (one
`batch_decode` per option group), so the cost per scheduler step does not grow with messages.
"""

from __future__ import annotations

import logging
import sys
import traceback
from multiprocessing.connection import Connection
from typing import Any

from detokenizer.incremental import DecodeOptions, DecodeStateTable, Tokenizer
from runtime.contracts.codec import TypeDispatcher, encode
from runtime.contracts.config import ServerConfig
from runtime.contracts.ipc import IpcDir, PullSocket, PushSocket, new_context
from runtime.contracts.messages import FAILED_KEY, BatchStrOut, BatchTokenOut, ChildReady, SchedulerCrashed, ShutdownReq

logger = logging.getLogger("radixserve.detokenizer")

RECV_TIMEOUT_MS = 1000  # the loop wakes at least this often (shutdown flag, liveness)
MAX_DECODE_STATES = 65536  # SGLang's SGLANG_DETOKENIZER_MAX_STATES


class DetokenizerManager:
    """Turns token-id batches into text-delta batches; pure apart from the tokenizer."""

    def __init__(self, tokenizer: Tokenizer, capacity: int = MAX_DECODE_STATES) -> None:
        self.table = DecodeStateTable(tokenizer, capacity)

    def handle_batch(self, out: BatchTokenOut) -> BatchStrOut:
        """Decode one scheduler step: every request's new text, other fields passed through.

        A request that finished on a stop token (`matched_stop_token`) does not decode that
        token unless `no_stop_trim`; its id still appears in `output_ids`.
        NOTE: a message inconsistent for one request (a rid twice in a step, ids after its final
        feed, an id the tokenizer cannot decode) fails that request alone, with finish_reason
        abort and `FAILED_KEY`, which tells the main process to abort it in the scheduler too;
        the others' texts are decoded as usual and this process goes on.
        """
        finished = [reason is not None for reason in out.finished_reasons]
        trim = [
            done and matched and not keep and len(ids) > 0
            for done, matched, keep, ids in zip(
                finished, out.matched_stop_token, out.no_stop_trim, out.new_ids
            )
        ]
        options = self._new_options(out)
        reasons = list(out.finished_reasons)
        matched = [_matched_stop(reason) for reason in reasons]
        if len(set(out.rids)) == len(out.rids):
            try:
                texts = self.table.feed_batch(out.rids, out.new_ids, finished, trim_last_token=trim,
                                              prompt_tails=out.decode_prefix, options=options,
                                              matched_stops=matched)
                return self._str_out(out, texts, reasons)
            except Exception:
                logger.exception("decoding a batch failed; decoding its requests one by one")
        texts = [self._feed_one(out, i, finished[i], trim[i], options[i], reasons, matched[i])
                 for i in range(len(out.rids))]
        return self._str_out(out, texts, reasons)

    def _feed_one(self, out: BatchTokenOut, i: int, finished: bool, trim: bool, options: DecodeOptions | None,
                  reasons: list[dict[str, Any] | None], matched: str | None) -> str:
        """Request i's text alone; on an inconsistency its state is dropped and it is failed."""
        rid = out.rids[i]
        try:
            if out.rids.index(rid) != i:
                raise ValueError(f"rid {rid} appears twice in one step")
            return self.table.feed_batch([rid], [out.new_ids[i]], [finished], trim_last_token=[trim],
                                         prompt_tails=[out.decode_prefix[i]], options=[options],
                                         matched_stops=[matched])[0]
        except Exception as exc:
            logger.error("request %s: its output could not be decoded (%r); failing it", rid, exc)
            self.table.discard(rid)
            reasons[i] = {"type": "abort", "message": f"the output could not be decoded: {exc}", FAILED_KEY: True}
            return ""

    def _str_out(self, out: BatchTokenOut, texts: list[str], reasons: list[dict[str, Any] | None]) -> BatchStrOut:
        decode_states = len(self.table)
        return BatchStrOut(
            rids=out.rids,
            finished_reasons=reasons,
            texts=texts,
            output_ids=out.new_ids,
            prompt_tokens=out.prompt_tokens,
            completion_tokens=out.completion_tokens,
            cached_tokens=out.cached_tokens,
            output_logprobs=out.output_logprobs,
            output_top_logprobs=out.output_top_logprobs,
            input_logprobs=out.input_logprobs,
            input_top_logprobs=out.input_top_logprobs,
            input_ids_for_logprobs=out.input_ids_for_logprobs,
            queue_times=out.queue_times,
            decode_states=decode_states,
            pinned_tokens=out.pinned_tokens,
            embeddings=out.embeddings,
        )

    def _new_options(self, out: BatchTokenOut) -> list[DecodeOptions | None]:
        """Decode options for rids the table does not know yet (None for known ones)."""
        return [
            None
            if rid in self.table
            else DecodeOptions(
                skip_special_tokens=out.skip_special_tokens[i],
                spaces_between_special_tokens=out.spaces_between_special_tokens[i],
                stop=tuple(out.stop_strs[i]),
                no_stop_trim=out.no_stop_trim[i],
            )
            for i, rid in enumerate(out.rids)
        ]


class _DetokenizerLoop:
    """The process loop: recv -> handle -> send, until ShutdownReq."""

    def __init__(self, manager: DetokenizerManager, ipc_path: str) -> None:
        ipc = IpcDir(ipc_path)
        self.manager = manager
        self.ctx = new_context()
        self.inbox = PullSocket(self.ctx, ipc.endpoint("detokenizer"), bind=True)
        self.to_tokenizer = PushSocket(self.ctx, ipc.endpoint("tokenizer"))
        self.running = True
        self.dispatch = TypeDispatcher(
            {BatchTokenOut: self._on_batch, ShutdownReq: self._on_shutdown}
        )

    def run(self) -> None:
        while self.running:
            msg = self.inbox.recv(timeout_ms=RECV_TIMEOUT_MS)
            if msg is not None:
                self.dispatch(msg)

    def _on_batch(self, msg: BatchTokenOut) -> None:
        self.to_tokenizer.send(self.manager.handle_batch(msg))

    def _on_shutdown(self, _: ShutdownReq) -> None:
        logger.info("shutting down")
        self.running = False

    def close(self) -> None:
        self.inbox.close()
        self.to_tokenizer.close()
        self.ctx.term()


def load_tokenizer(config: ServerConfig, class_ref: str | None = None) -> Any:
    """The Hugging Face tokenizer of the served model (`class_ref`: see `runtime.support.tokenizer_load`)."""
    from runtime.support import tokenizer_load

    return tokenizer_load.load_tokenizer(tokenizer_load.tokenizer_source(config), class_ref)


def run_detokenizer_process(
    config: ServerConfig, ipc_path: str, ready_conn: Connection, tokenizer_class: str | None = None
) -> None:
    """Entry point of the detokenizer process (spawned by `tokenizer.launch`).

    Args:
        tokenizer_class: the launcher's `runtime.support.tokenizer_load.class_ref` of the tokenizer; with
            it this process imports neither transformers' auto classes nor torch.
    """
    from runtime.support.procutil import configure_child, watch_parent

    configure_child(config, "detokenizer")
    watch_parent()
    loop: _DetokenizerLoop | None = None
    try:
        loop = _DetokenizerLoop(DetokenizerManager(load_tokenizer(config, tokenizer_class)), ipc_path)
        ready_conn.send_bytes(encode(ChildReady("detokenizer", {})))
        loop.run()
    except Exception:
        tb = traceback.format_exc()
        logger.error("detokenizer crashed:\n%s", tb)
        _report_crash(loop, ipc_path, tb)
        sys.exit(1)
    finally:
        if loop is not None:
            loop.close()


def _report_crash(loop: _DetokenizerLoop | None, ipc_path: str, tb: str) -> None:
    """Tell the main process (best effort: the socket may be what failed)."""
    crash = SchedulerCrashed("detokenizer", tb)
    try:
        if loop is not None:
            loop.to_tokenizer.send(crash)
            return
        ctx = new_context()
        push = PushSocket(ctx, IpcDir(ipc_path).endpoint("tokenizer"))
        push.send(crash)
        push.close()
        ctx.term()
    except Exception:
        logger.exception("could not report the crash to the main process")


def _matched_stop(reason: dict[str, Any] | None) -> str | None:
    """The stop string the scheduler matched, when that ended the request (a stop token's
    `matched` is its id, an int)."""
    matched = reason.get("matched") if reason is not None and reason.get("type") == "stop" else None
    return matched if isinstance(matched, str) else None
