"""No client can touch another's work: /abort_request (a rid, or abort_all) ends only the caller's
own requests, whoever knows or guesses a rid. The caller is its bearer token (or x-api-key)."""

from __future__ import annotations

import threading
from typing import Any

import orjson
import requests

from tests.tokenizer.http_helpers import RunningServer, post, wait_idle

ALICE = {"Authorization": "Bearer alice"}
BOB = {"Authorization": "Bearer bob"}


def _start_stream(server: RunningServer, rid: str, headers: dict[str, str],
                  out: dict[str, Any]) -> threading.Thread:
    body = {"text": "Count to a thousand:", "rid": rid, "stream": True,
            "sampling_params": {"max_new_tokens": 400, "temperature": 0, "ignore_eos": True}}

    def run() -> None:
        with requests.post(server.url + "/generate", json=body, headers=headers, stream=True, timeout=300) as resp:
            for line in resp.iter_lines():
                if line.startswith(b"data: {"):
                    out["last"] = orjson.loads(line[len(b"data: "):])
                    out["chunks"] = out.get("chunks", 0) + 1

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def _wait_chunks(out: dict[str, Any], count: int) -> None:
    import time

    deadline = time.monotonic() + 120
    while out.get("chunks", 0) < count and time.monotonic() < deadline:
        time.sleep(0.05)
    assert out.get("chunks", 0) >= count, out


def test_another_owner_cannot_abort_a_request(shared_server: RunningServer) -> None:
    out: dict[str, Any] = {}
    thread = _start_stream(shared_server, "owned-1", ALICE, out)
    _wait_chunks(out, 3)
    for body in ({"rid": "owned-1"}, {"abort_all": True}):
        assert post(shared_server, "/abort_request", body, headers=BOB).status_code == 200
    seen = out["chunks"]
    _wait_chunks(out, seen + 5)  # still running after bob's aborts
    assert out["last"]["meta_info"]["finish_reason"] is None
    assert post(shared_server, "/abort_request", {"rid": "owned-1"}, headers=ALICE).status_code == 200
    thread.join(timeout=120)
    assert not thread.is_alive()
    assert out["last"]["meta_info"]["finish_reason"]["type"] == "abort"
    wait_idle(shared_server)


def test_abort_all_ends_only_the_callers_requests(shared_server: RunningServer) -> None:
    mine: dict[str, Any] = {}
    theirs: dict[str, Any] = {}
    threads = [_start_stream(shared_server, "a-mine", ALICE, mine),
               _start_stream(shared_server, "a-theirs", BOB, theirs)]
    _wait_chunks(mine, 2)
    _wait_chunks(theirs, 2)
    assert post(shared_server, "/abort_request", {"abort_all": True}, headers=ALICE).status_code == 200
    threads[0].join(timeout=120)
    assert mine["last"]["meta_info"]["finish_reason"]["type"] == "abort"
    seen = theirs["chunks"]
    _wait_chunks(theirs, seen + 5)
    assert post(shared_server, "/abort_request", {"abort_all": True}, headers=BOB).status_code == 200
    threads[1].join(timeout=120)
    assert theirs["last"]["meta_info"]["finish_reason"]["type"] == "abort"
    wait_idle(shared_server)
