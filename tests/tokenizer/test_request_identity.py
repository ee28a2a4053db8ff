"""Client rids are labels through the real server (issue 18): the live case that took the whole
server down, and what a client may and may not do with a rid. The manager-level cases (a live
rid refused, "v" never aborting "v_3", batch rids) are in test_manager.py; the detokenizer's own
resilience in tests/detokenizer/test_manager.py."""

from __future__ import annotations

import json
import threading
from typing import Any

import requests

from tests.tokenizer.http_helpers import RunningServer, post, server_state, sse_events, wait_idle, wait_until


def _generate(server: RunningServer, rid: str, tokens: int, stream: bool = False, **kw: Any) -> requests.Response:
    body = {"text": "Count slowly from one to one hundred:", "rid": rid, "stream": stream,
            "sampling_params": {"max_new_tokens": tokens, "temperature": 0, "ignore_eos": True}}
    return post(server, "/generate", body, stream=stream, **kw)


def test_reusing_the_rid_of_a_stream_its_client_left_keeps_the_server_up(shared_server: RunningServer) -> None:
    """Stream rid "d", read one line, disconnect; send rid "d" again at once: it is served, and so
    is everything after it (before: the detokenizer died and the server with it)."""
    server = shared_server
    for _ in range(3):
        with _generate(server, "d", 200, stream=True) as stream:
            first = next(sse_events(stream))
            assert json.loads(first)["meta_info"]["id"] == "d"
        again = _generate(server, "d", 4)
        assert again.status_code == 200, again.text
        assert again.json()["meta_info"]["id"] == "d" and again.json()["meta_info"]["completion_tokens"] == 4
    assert requests.get(server.url + "/health", timeout=10).status_code == 200
    state = wait_idle(server, timeout=60)
    assert state.get("integrity", "ok") == "ok", state


def test_a_live_rid_is_a_400_naming_rid_and_abort_finds_it_by_name(shared_server: RunningServer) -> None:
    server = shared_server
    results: list[requests.Response] = []
    worker = threading.Thread(target=lambda: results.append(_generate(server, "mine", 400, timeout=120)))
    worker.start()
    wait_until(lambda: server_state(server)["running"] >= 1, "rid 'mine' to run", timeout=60)
    taken = _generate(server, "mine", 1)
    error = taken.json()["error"]
    assert error["param"] == "rid" and "already in use" in error["message"]
    other = _generate(server, "mine_3", 2)  # another client's rid that merely starts the same
    assert other.status_code == 200 and other.json()["meta_info"]["id"] == "mine_3"
    assert post(server, "/abort_request", {"rid": "mine"}).status_code == 200
    worker.join(120)
    assert results[0].status_code == 200
    assert results[0].json()["meta_info"]["finish_reason"]["type"] == "abort"
    assert wait_idle(server, timeout=60).get("integrity", "ok") == "ok"
