"""SGLang's native endpoints: what /generate, /health_generate, /get_model_info,
/get_server_info and /abort_request do beyond HTTP mapping.

/generate bodies go to `TokenizerManager.generate` unchanged: it validates them, grammar
constraints (`sampling_params.json_schema` as text or an object, `regex`, `ebnf`) included.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from typing import TYPE_CHECKING, Any

from runtime.contracts.config import read_model_json
from runtime.contracts.errors import InvalidRequest
from tokenizer.metrics import HEALTH_RID_PREFIX
from tokenizer.streaming import last_result

if TYPE_CHECKING:
    from tokenizer.server_state import ServerState

HEALTH_TIMEOUT_S = 20.0
VERSION = "0.1.0"


def check_generate_body(body: Any) -> dict[str, Any]:
    """A /generate body: a JSON object (everything else is checked by the manager)."""
    if not isinstance(body, dict):
        raise InvalidRequest("the request body must be a JSON object")
    return body


class NativeRenderer:
    """SGLang's shapes as they come from the manager: cumulative `text` in every chunk."""

    def __init__(self, stream: bool) -> None:
        self.stream = stream

    def translate(self, exc: InvalidRequest) -> InvalidRequest:
        return exc

    def final(self, result: Any) -> Any:
        return result

    def start(self) -> list[Any]:
        return []

    def chunks(self, out: dict[str, Any]) -> list[Any]:
        return [out]

    def end(self) -> list[Any]:
        return []


async def health_generate(server: ServerState) -> bool:
    """Run a one-token greedy generation; True if it finished within the timeout.

    NOTE: the probe's rid starts with HEALTH_RID_PREFIX, which the metrics skip.
    """
    tm = server.accepting_manager()
    body = {"input_ids": [0], "rid": f"{HEALTH_RID_PREFIX}{uuid.uuid4().hex}",
            "sampling_params": {"max_new_tokens": 1, "temperature": 0}}
    results = await tm.generate(body)
    with server.track():
        async with contextlib.aclosing(results):  # type: ignore[type-var]
            try:
                out = await asyncio.wait_for(last_result(results), HEALTH_TIMEOUT_S)
            except TimeoutError:
                return False
    return bool(out) and out["meta_info"]["finish_reason"] is not None


def model_info(server: ServerState) -> dict[str, Any]:
    """/get_model_info: SGLang's RuntimeEndpoint picks a chat template from `model_path`."""
    config = server.config
    hf = read_model_json(config.model_path, "config.json") if config.model_path else {}
    return {
        "model_path": config.model_path,
        "tokenizer_path": config.tokenizer_path or config.model_path,
        "is_generation": True,
        "served_model_name": server.model_name,
        "context_length": config.context_length,
        "preferred_sampling_params": None,
        "weight_version": "default",
        # sglang-router labels its workers with these (the HF config's)
        "model_type": hf.get("model_type"),
        "architectures": hf.get("architectures"),
    }


async def server_info(server: ServerState) -> dict[str, Any]:
    """/get_server_info: config without secrets, scheduler info and its live state."""
    tm = server.manager()
    info = await tm.get_server_info()
    server.metrics.prune(tm.rid_to_state)  # requests whose client left are not tracked past here
    info.update(version=VERSION, status=server.phase.value, served_model_name=server.model_name,
                requests_in_flight=server.inflight)
    info["tokenizer_state"]["metrics_tracked"] = server.metrics.tracked_requests()
    # The names SGLang's tools read (bench_serving, the router, dashboards).
    info["max_total_num_tokens"] = info.get("max_total_tokens")
    if info.get("context_length"):
        info["max_req_input_len"] = info["context_length"] - 1
    for state in info.get("internal_states", []):
        state["last_gen_throughput"] = server.metrics.last_gen_throughput
    return info


async def load(server: ServerState) -> list[dict[str, Any]]:
    """/get_load: SGLang's per-data-parallel-rank load, which sglang-router's load monitor reads
    (one rank here). num_tokens counts the KV slots requests hold (cached prefixes nobody uses
    are free to evict, so they are not load)."""
    state = await server.manager().get_state()
    held = state["kv_total"] - state["kv_available"] - state["kv_evictable"]
    return [{
        "dp_rank": 0,
        "num_reqs": state["running"] + state["waiting"],
        "num_waiting_reqs": state["waiting"],
        "num_tokens": held,
    }]


async def abort_request(server: ServerState, body: Any) -> dict[str, Any]:
    """/abort_request: `{"rid": str}` (a prefix: n>1 children go too) or `{"abort_all": true}`."""
    if not isinstance(body, dict):
        raise InvalidRequest("the request body must be a JSON object")
    rid, abort_all = body.get("rid"), body.get("abort_all", False)
    if not isinstance(abort_all, bool):
        raise InvalidRequest("abort_all must be a boolean", param="abort_all")
    tm = server.manager()
    if abort_all:
        await tm.abort_all()
        return {"success": True, "abort_all": True}
    if not isinstance(rid, str) or not rid:
        raise InvalidRequest("give rid (a non-empty string) or abort_all: true", param="rid")
    await tm.abort(rid)
    return {"success": True, "rid": rid}
