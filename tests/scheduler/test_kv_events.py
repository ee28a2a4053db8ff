"""KVEventPublisher: a subscriber rebuilds the pool's block set from the stream, replay answers
from a sequence number on, and the bytes are those vLLM's own msgspec structs encode.

The subscriber here does what a KV-aware router does with vLLM's stream: SUB, check sequence
numbers, decode with plain msgpack, and apply stored (add) / removed (discard) / cleared (empty).
"""

from __future__ import annotations

import random
import time
from collections.abc import Iterator
from typing import Any

import msgpack
import pytest
import zmq

from radix.blocks import BlockHash, BlockHasher, event_id
from runtime.contracts.config import ServerConfig
from runtime.contracts.ipc import IpcDir
from scheduler.kv_events import END_SEQ, MEDIUM_CPU, KVEventPublisher, from_config

pytestmark = pytest.mark.timeout(30)

BS = 4  # tokens per block
DEADLINE_S = 5.0
Endpoints = tuple[str, str]  # PUB, replay ROUTER


@pytest.fixture
def ctx() -> Iterator[zmq.Context[Any]]:
    context: zmq.Context[Any] = zmq.Context()
    yield context
    context.destroy(linger=0)


@pytest.fixture
def endpoints() -> Iterator[Endpoints]:
    """The PUB and the replay endpoints, in a private directory removed afterwards."""
    with IpcDir() as ipc:
        yield ipc.endpoint("events"), ipc.endpoint("replay")


class Subscriber:
    """Rebuilds the set of stored block ids from the stream, checking sequence numbers."""

    def __init__(self, ctx: zmq.Context[Any], endpoint: str, topic: bytes = b"") -> None:
        self.sock = ctx.socket(zmq.SUB)
        self.sock.setsockopt(zmq.SUBSCRIBE, topic)
        self.sock.connect(endpoint)
        self.topic = topic
        self.blocks: set[int] = set()
        self.last_seq = -1

    def receive(self, timeout_ms: int) -> bool:
        """Apply one batch if one arrives within `timeout_ms`."""
        if not self.sock.poll(timeout_ms):
            return False
        topic, seq_bytes, payload = self.sock.recv_multipart()
        seq = int.from_bytes(seq_bytes, "big")
        assert topic == self.topic
        assert self.last_seq < 0 or seq == self.last_seq + 1, f"gap: {self.last_seq} then {seq}"
        self.last_seq = seq
        ts, events, rank = msgpack.unpackb(payload)
        assert isinstance(ts, float) and rank == 0
        for event in events:
            kind = event["type"]
            if kind == "BlockStored":
                assert len(event["token_ids"]) == len(event["block_hashes"]) * event["block_size"]
                self.blocks.update(event["block_hashes"])
            elif kind == "BlockRemoved":
                self.blocks.difference_update(event["block_hashes"])
            else:
                assert kind == "AllBlocksCleared", kind
                self.blocks.clear()
        return True

    def join(self, pub: KVEventPublisher) -> None:
        """Wait out PUB/SUB's slow joiner: publish probe batches (a clear, harmless before any
        block is stored) until one arrives."""
        deadline = time.monotonic() + DEADLINE_S
        while True:
            pub.cleared()
            pub.flush()
            if self.receive(20):
                return
            assert time.monotonic() < deadline, "the subscription never came up"

    def catch_up(self, pub: KVEventPublisher) -> None:
        """Receive until the last batch `pub` sent."""
        deadline = time.monotonic() + DEADLINE_S
        while self.last_seq < pub.next_seq - 1:
            self.receive(50)
            assert time.monotonic() < deadline, f"stuck at seq {self.last_seq} of {pub.next_seq - 1}"


class Pool:
    """Drives a sink like the radix cache does, and keeps the expected block set."""

    def __init__(self, pub: KVEventPublisher) -> None:
        self.pub = pub
        self.hasher = BlockHasher(BS, "test-model")
        self.expected: set[int] = set()

    def store(self, tokens: list[int], first: int, count: int) -> list[BlockHash]:
        """Store blocks [first, first + count) of `tokens`."""
        hashes = self.hasher.hashes(tokens, None)
        parent = hashes[first - 1] if first else None
        stored = hashes[first : first + count]
        self.pub.stored(stored, parent, tokens[first * BS : (first + count) * BS])
        self.expected.update(event_id(h) for h in stored)
        return stored

    def remove(self, hashes: list[BlockHash]) -> None:
        self.pub.removed(hashes)
        self.expected.difference_update(event_id(h) for h in hashes)

    def clear(self) -> None:
        self.pub.cleared()
        self.expected.clear()


def test_a_subscriber_rebuilds_the_pool_from_a_scripted_sequence(ctx: zmq.Context[Any], endpoints: Endpoints) -> None:
    endpoint, _ = endpoints
    pub = KVEventPublisher(endpoint, BS, topic="kv", ctx=ctx)
    sub = Subscriber(ctx, endpoint, b"kv")
    try:
        sub.join(pub)
        pool = Pool(pub)
        a, b = list(range(100, 116)), list(range(200, 212))
        a01 = pool.store(a, 0, 2)
        assert pub.flush() is not None
        a2 = pool.store(a, 2, 1)
        b012 = pool.store(b, 0, 3)
        pub.flush()
        pool.remove(a2)
        pool.remove(b012[1:])
        pub.flush()
        assert pub.flush() is None, "a step without events sends nothing"
        pool.clear()
        pool.store(b, 0, 2)
        pub.flush()
        pool.remove(a01)  # already gone with the clear: a no-op for the subscriber
        pool.store(a, 0, 4)
        pool.remove(a01[1:])
        pub.flush()
        sub.catch_up(pub)
        assert sub.blocks == pool.expected
        assert len(pool.expected) == 5
    finally:
        sub.sock.close(linger=0)
        pub.close()


def test_a_subscriber_follows_a_random_sequence(ctx: zmq.Context[Any], endpoints: Endpoints) -> None:
    endpoint, _ = endpoints
    pub = KVEventPublisher(endpoint, BS, ctx=ctx)
    sub = Subscriber(ctx, endpoint)
    rng = random.Random(7)
    try:
        sub.join(pub)
        pool = Pool(pub)
        live: list[BlockHash] = []
        for _ in range(200):
            for _ in range(rng.randrange(4)):
                op = rng.random()
                if op < 0.55:
                    tokens = [rng.randrange(50) for _ in range(BS * rng.randint(1, 4))]
                    n = len(tokens) // BS
                    first = rng.randrange(n)
                    live += pool.store(tokens, first, rng.randint(1, n - first))
                elif op < 0.95 and live:
                    gone = rng.sample(live, rng.randint(1, min(3, len(live))))
                    pool.remove(gone)
                    live = [h for h in live if h not in gone]
                else:
                    pool.clear()
                    live = []
            pub.flush()
        sub.catch_up(pub)
        assert sub.blocks == pool.expected
    finally:
        sub.sock.close(linger=0)
        pub.close()


def request_replay(pub: KVEventPublisher, sock: zmq.Socket[Any], frames: list[bytes]) -> list[list[bytes]]:
    """Send a replay request and collect the replies up to the end marker, answering it the way the
    scheduler would: `poll_replay()` once per loop iteration."""
    sock.send_multipart(frames)
    replies: list[list[bytes]] = []
    deadline = time.monotonic() + DEADLINE_S
    while not replies or replies[-1][-2:] != [END_SEQ, b""]:
        pub.poll_replay()
        if sock.poll(10):
            replies.append(sock.recv_multipart())
        assert time.monotonic() < deadline, f"no end marker after {len(replies)} replies"
    return replies


def test_replay_answers_from_a_sequence_number_on(ctx: zmq.Context[Any], endpoints: Endpoints) -> None:
    endpoint, replay_endpoint = endpoints
    pub = KVEventPublisher(endpoint, BS, replay_endpoint=replay_endpoint, topic="kv", buffer_steps=5, ctx=ctx)
    dealer = ctx.socket(zmq.DEALER)
    dealer.connect(replay_endpoint)
    hasher = BlockHasher(BS, "m")
    try:
        for step in range(8):  # nobody listens: the batches are still numbered and kept
            tokens = [step] * BS
            pub.stored(hasher.hashes(tokens, None), None, tokens)
            assert pub.flush() == step
        # vLLM's framing: [b"", start_seq] -> [b"", topic, seq, payload] ..., [b"", b"", -1, b""]
        replies = request_replay(pub, dealer, [b"", (4).to_bytes(8, "big")])
        assert [r[:3] for r in replies[:-1]] == [[b"", b"kv", s.to_bytes(8, "big")] for s in range(4, 8)]
        assert replies[-1] == [b"", b"", END_SEQ, b""]
        stored = [msgpack.unpackb(r[3])[1][0] for r in replies[:-1]]
        assert [e["token_ids"] for e in stored] == [[s] * BS for s in range(4, 8)]
        # Before the buffer (5 batches): what is left; past the end: only the marker.
        assert [r[2] for r in request_replay(pub, dealer, [b"", bytes(8)])[:-1]] == [
            s.to_bytes(8, "big") for s in range(3, 8)]
        assert request_replay(pub, dealer, [b"", (99).to_bytes(8, "big")]) == [[b"", b"", END_SEQ, b""]]
        # A malformed request is skipped; the next one is answered. A DEALER without the
        # delimiter gets replies without it.
        dealer.send_multipart([b"", b"short"])
        (last, end) = request_replay(pub, dealer, [(7).to_bytes(8, "big")])
        assert (last[:2], end) == ([b"kv", (7).to_bytes(8, "big")], [b"", END_SEQ, b""])
    finally:
        dealer.close(linger=0)
        pub.close()


def test_a_req_socket_gets_the_first_replayed_batch(ctx: zmq.Context[Any], endpoints: Endpoints) -> None:
    """vLLM's example subscriber asks with REQ, which keeps only the first reply."""
    endpoint, replay_endpoint = endpoints
    pub = KVEventPublisher(endpoint, BS, replay_endpoint=replay_endpoint, ctx=ctx)
    req = ctx.socket(zmq.REQ)
    req.connect(replay_endpoint)
    try:
        for _ in range(2):
            pub.cleared()
            pub.flush()
        req.send((1).to_bytes(8, "big"))
        deadline = time.monotonic() + DEADLINE_S
        while not req.poll(10):
            pub.poll_replay()
            assert time.monotonic() < deadline, "no reply"
        topic, seq, payload = req.recv_multipart()  # REQ strips the empty delimiter
        assert (topic, seq) == (b"", (1).to_bytes(8, "big"))
        assert msgpack.unpackb(payload)[1] == [{"type": "AllBlocksCleared"}]
    finally:
        req.close(linger=0)
        pub.close()


# vllm.distributed.kv_events of vLLM 0.32.0 (msgspec 0.23.0) encodes
#   KVEventBatch(ts=1757500000.25, data_parallel_rank=0, events=[
#     BlockStored(block_hashes=[2**62 + 5, 7], parent_block_hash=None,
#                 token_ids=[0, 1, 127, 128, 255, 256, 65535, 65536], block_size=4,
#                 lora_id=None, medium="GPU", lora_name=None),
#     BlockStored(block_hashes=[9], parent_block_hash=7, token_ids=[128000, 2, 3, 4], block_size=4,
#                 lora_id=None, medium="GPU", lora_name=None),
#     BlockRemoved(block_hashes=[7, 9], medium="GPU"),
#     AllBlocksCleared()])
# as these bytes (token ids span every msgpack integer width):
VLLM_BYTES = bytes.fromhex(
    "93cb41da3054981000009488a474797065ab426c6f636b53746f726564ac626c6f636b5f68617368657392cf4000"
    "00000000000507b1706172656e745f626c6f636b5f68617368c0a9746f6b656e5f6964739800017fcc80ccffcd01"
    "00cdffffce00010000aa626c6f636b5f73697a6504a76c6f72615f6964c0a66d656469756da3475055a96c6f7261"
    "5f6e616d65c088a474797065ab426c6f636b53746f726564ac626c6f636b5f6861736865739109b1706172656e74"
    "5f626c6f636b5f6861736807a9746f6b656e5f69647394ce0001f400020304aa626c6f636b5f73697a6504a76c6f"
    "72615f6964c0a66d656469756da3475055a96c6f72615f6e616d65c083a474797065ac426c6f636b52656d6f7665"
    "64ac626c6f636b5f686173686573920709a66d656469756da347505581a474797065b0416c6c426c6f636b73436c"
    "656172656400")


def hash_with_id(block_id: int) -> BlockHash:
    """A block hash whose `event_id` is `block_id`."""
    return (block_id << 1).to_bytes(8, "big") + bytes(8)


def test_the_encoding_is_vllms_byte_for_byte(ctx: zmq.Context[Any], endpoints: Endpoints,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    endpoint, replay_endpoint = endpoints
    pub = KVEventPublisher(endpoint, BS, replay_endpoint=replay_endpoint, ctx=ctx)
    dealer = ctx.socket(zmq.DEALER)
    dealer.connect(replay_endpoint)
    a, b, c = hash_with_id(2**62 + 5), hash_with_id(7), hash_with_id(9)
    try:
        pub.stored([a, b], None, [0, 1, 127, 128, 255, 256, 65535, 65536])
        pub.stored([c], b, [128000, 2, 3, 4])
        pub.removed([b, c])
        pub.cleared()
        monkeypatch.setattr(time, "time", lambda: 1757500000.25)
        pub.flush()
        monkeypatch.undo()
        payload = request_replay(pub, dealer, [b"", bytes(8)])[0][3]
    finally:
        dealer.close(linger=0)
        pub.close()
    ts, events, rank = msgpack.unpackb(payload)  # the batch is an array (vLLM: array_like=True)
    assert (ts, rank) == (1757500000.25, 0)
    # Each event is a map: the tag first, then vLLM's field order, defaults left out.
    assert [list(e) for e in events] == [
        ["type", "block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium", "lora_name"],
        ["type", "block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium", "lora_name"],
        ["type", "block_hashes", "medium"],
        ["type"],
    ]
    assert payload == VLLM_BYTES


def test_medium_and_rank_come_from_the_constructor(ctx: zmq.Context[Any], endpoints: Endpoints) -> None:
    endpoint, replay_endpoint = endpoints
    pub = KVEventPublisher(endpoint, BS, replay_endpoint=replay_endpoint, medium=MEDIUM_CPU,
                           data_parallel_rank=3, ctx=ctx)
    dealer = ctx.socket(zmq.DEALER)
    dealer.connect(replay_endpoint)
    try:
        pub.removed([hash_with_id(1)])
        pub.flush()
        _, events, rank = msgpack.unpackb(request_replay(pub, dealer, [b"", bytes(8)])[0][3])
        assert rank == 3 and events == [{"type": "BlockRemoved", "block_hashes": [1], "medium": "CPU"}]
    finally:
        dealer.close(linger=0)
        pub.close()


def test_from_config(ctx: zmq.Context[Any], endpoints: Endpoints) -> None:
    assert from_config(ServerConfig(), device_is_cuda=True) is None  # --kv-events is off by default
    endpoint, replay_endpoint = endpoints
    config = ServerConfig(kv_events=endpoint, kv_events_replay=replay_endpoint, kv_block_size=64)
    pub = from_config(config, device_is_cuda=True)
    assert pub is not None
    dealer = ctx.socket(zmq.DEALER)
    dealer.connect(replay_endpoint)
    try:
        pub.stored([hash_with_id(5)], None, list(range(64)))
        pub.flush()
        _, (event,), _ = msgpack.unpackb(request_replay(pub, dealer, [b"", bytes(8)])[0][3])
        assert (event["block_size"], event["medium"]) == (64, "GPU")
    finally:
        dealer.close(linger=0)
        pub.close()
