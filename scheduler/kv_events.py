"""KV cache events in vLLM's wire format: which blocks enter and leave the KV pool, published on a
ZMQ PUB socket, with a ROUTER socket that replays recent batches to subscribers that missed some.

Routers that read the stream of vLLM's `--kv-events-config` (llm-d, Dynamo) read these unmodified.
The format follows vLLM 0.32.0 (`vllm/distributed/kv_events.py`), which includes
vllm-project/vllm#42892 (from vLLM 0.26 each event is a tagged msgpack map; before, a tagged array,
which consumers written for older vLLM still expect) and #45177 (replay replies carry the topic).

Wire format (msgspec Structs there, plain msgpack here; the test checks the bytes are equal):

    PUB message:  [topic, seq (8 bytes, big-endian), payload]      seq = 0, 1, 2, ... per batch
    payload:      [ts (float64, time.time()), [event, ...], data_parallel_rank]   (an array)
    event:        a map, the tag first under "type", then the fields in vLLM's order; fields
                  still at their default (extra_keys, group_idx, ...) are left out, as msgspec's
                  omit_defaults does:
        {"type": "BlockStored", "block_hashes": [int], "parent_block_hash": int | nil,
         "token_ids": [int], "block_size": int, "lora_id": nil, "medium": str, "lora_name": nil}
        {"type": "BlockRemoved", "block_hashes": [int], "medium": str}
        {"type": "AllBlocksCleared"}

    Replay request (ROUTER receives):  [identity, b"", start_seq (8 bytes, big-endian)]
    reply, per buffered batch with seq >= start_seq:  [identity, b"", topic, seq, payload]
    then the end marker:  [identity, b"", b"", -1 (8 bytes, signed big-endian), b""]
    (a request without the empty frame, from a bare DEALER, is answered without it too)

Unlike vLLM, the PUB socket always binds (vLLM connects when the endpoint names a host).

No thread: the scheduler's thread owns both sockets (ZMQ sockets are not thread-safe). It calls
`flush()` once per loop iteration and `poll_replay()` there too; neither blocks.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Sequence
from itertools import islice
from typing import TYPE_CHECKING, Any

import msgpack
import zmq

from radix.blocks import BlockHash, event_id

if TYPE_CHECKING:
    from runtime.contracts.config import ServerConfig

logger = logging.getLogger(__name__)

MEDIUM_GPU = "GPU"
MEDIUM_CPU = "CPU"
TAG = "type"  # the key msgspec's tag=True writes the class name under
END_SEQ = (-1).to_bytes(8, "big", signed=True)
SEQ_BYTES = 8


class KVEventPublisher:
    """A `BlockEventSink` that sends each step's events as one vLLM `KVEventBatch`.

    Args:
        endpoint: the PUB socket binds here, e.g. tcp://*:5557 or ipc:///tmp/kv-events.
        block_size: tokens per block (`kv_block_size`).
        medium: "GPU" when the KV pool is on CUDA, else "CPU".
        replay_endpoint: the ROUTER socket binds here; None: no replay.
        topic: the first frame of every message; subscribers filter on its prefix.
        data_parallel_rank: the batch's third field (vLLM always sends it).
        buffer_steps: how many batches are kept for replay (vLLM's default too).
        hwm: the PUB socket's send high-water mark; past it ZMQ drops messages, never blocks.
        ctx: the process's ZMQ context; None: pyzmq's shared `Context.instance()`.
    """

    def __init__(self, endpoint: str, block_size: int, *, medium: str = MEDIUM_GPU,
                 replay_endpoint: str | None = None, topic: str = "", data_parallel_rank: int = 0,
                 buffer_steps: int = 10_000, hwm: int = 100_000, ctx: zmq.Context[Any] | None = None) -> None:
        assert block_size >= 1, f"block_size must be >= 1, got {block_size}"
        assert buffer_steps >= 1, f"buffer_steps must be >= 1, got {buffer_steps}"
        self.block_size = block_size
        self.medium = medium
        self.topic = topic.encode()
        self.data_parallel_rank = data_parallel_rank
        self.next_seq = 0  # the sequence number of the next batch sent
        self._events: list[dict[str, Any]] = []  # this step's, in the order they happened
        self._sent: deque[tuple[int, bytes]] = deque(maxlen=buffer_steps)  # (seq, payload)
        self._ctx: zmq.Context[Any] = zmq.Context.instance() if ctx is None else ctx
        self._pub = _bind(self._ctx, zmq.PUB, endpoint, hwm)
        self._replay: zmq.Socket[bytes] | None = None
        if replay_endpoint is not None:
            try:
                # NOTE: ROUTER drops what overflows a subscriber's queue, and ZMQ hands read
                # credit back in chunks of up to half the high-water mark: twice a whole replay
                # (batches + end marker) leaves room for one more after the last was read.
                self._replay = _bind(self._ctx, zmq.ROUTER, replay_endpoint, 2 * (buffer_steps + 1))
            except zmq.ZMQError:
                self._pub.close(linger=0)
                raise

    # --- BlockEventSink -------------------------------------------------------------------------

    def stored(self, hashes: Sequence[BlockHash], parent: BlockHash | None, token_ids: Sequence[int]) -> None:
        """Blocks `hashes` entered the pool; `token_ids` are all their tokens."""
        if not hashes:
            return
        assert len(token_ids) == len(hashes) * self.block_size, (
            f"{len(hashes)} blocks of {self.block_size} tokens, but {len(token_ids)} token ids")
        self._events.append({
            TAG: "BlockStored",
            "block_hashes": [event_id(h) for h in hashes],
            "parent_block_hash": None if parent is None else event_id(parent),
            "token_ids": list(token_ids),
            "block_size": self.block_size,
            "lora_id": None,
            "medium": self.medium,
            "lora_name": None,
        })

    def removed(self, hashes: Sequence[BlockHash]) -> None:
        """Blocks `hashes` left the pool."""
        if hashes:
            self._events.append({TAG: "BlockRemoved", "block_hashes": [event_id(h) for h in hashes],
                                 "medium": self.medium})

    def cleared(self) -> None:
        """Every block left the pool."""
        self._events.append({TAG: "AllBlocksCleared"})

    # --- the scheduler's calls ------------------------------------------------------------------

    def flush(self) -> int | None:
        """Send the events heard since the last flush as one batch.

        Returns:
            The batch's sequence number, or None when there were no events (nothing is sent).
        """
        if not self._events:
            return None
        payload: bytes = msgpack.packb([time.time(), self._events, self.data_parallel_rank])
        self._events = []
        seq = self.next_seq
        self.next_seq += 1
        # NOTE: a PUB socket never blocks: past its high-water mark it drops the message, and a
        # subscriber sees the gap in the sequence numbers and asks for a replay.
        self._pub.send_multipart((self.topic, seq.to_bytes(SEQ_BYTES, "big"), payload), zmq.NOBLOCK)
        self._sent.append((seq, payload))
        return seq

    def poll_replay(self) -> int:
        """Answer every replay request waiting on the ROUTER socket, without blocking.

        Returns:
            How many requests were answered (malformed ones are logged and skipped).
        """
        if self._replay is None:
            return 0
        answered = 0
        while True:
            try:
                frames: list[bytes] = self._replay.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return answered
            answered += self._answer(self._replay, frames)

    def _answer(self, router: zmq.Socket[bytes], frames: list[bytes]) -> int:
        # [identity, b"", start_seq] from a REQ socket, or a DEALER that sends the empty frame (the
        # only form vLLM accepts); [identity, start_seq] from a bare DEALER. Replies keep the form.
        envelope, start = frames[:-1], frames[-1]
        if not (len(envelope) == 1 or (len(envelope) == 2 and envelope[1] == b"")) or len(start) != SEQ_BYTES:
            logger.warning("ignoring a malformed KV events replay request of %d frames", len(frames))
            return 0
        start_seq = int.from_bytes(start, "big")
        skip = max(0, start_seq - self._sent[0][0]) if self._sent else 0  # seqs in _sent are consecutive
        for seq, payload in islice(self._sent, skip, None):
            router.send_multipart((*envelope, self.topic, seq.to_bytes(SEQ_BYTES, "big"), payload), zmq.NOBLOCK)
        router.send_multipart((*envelope, b"", END_SEQ, b""), zmq.NOBLOCK)
        return 1

    def close(self) -> None:
        """Close both sockets at once, dropping anything unsent; the context stays open."""
        self._pub.close(linger=0)
        if self._replay is not None:
            self._replay.close(linger=0)


def _bind(ctx: zmq.Context[Any], kind: int, endpoint: str, sndhwm: int) -> zmq.Socket[bytes]:
    sock: zmq.Socket[bytes] = ctx.socket(kind)
    sock.setsockopt(zmq.SNDHWM, sndhwm)
    sock.setsockopt(zmq.LINGER, 0)
    try:
        sock.bind(endpoint)
    except zmq.ZMQError:
        sock.close()
        raise
    return sock


def from_config(config: ServerConfig, device_is_cuda: bool) -> KVEventPublisher | None:
    """The publisher `--kv-events` asks for, or None when it is off."""
    if config.kv_events is None:
        return None
    return KVEventPublisher(config.kv_events, config.kv_block_size, replay_endpoint=config.kv_events_replay,
                            medium=MEDIUM_GPU if device_is_cuda else MEDIUM_CPU)
