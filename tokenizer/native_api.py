"""SGLang's native endpoints beside /generate (`native/generate.py`): what /health_generate,
/get_model_info, /get_server_info, /get_load and /abort_request do beyond HTTP mapping.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from runtime.contracts.config import read_model_json
from runtime.contracts.errors import InvalidRequest
from tokenizer import openapi
from tokenizer.core.events import Update
from tokenizer.core.pipeline import generate
from tokenizer.core.request import GenRequest, PromptRequest
from tokenizer.core.spec import parse
from tokenizer.metrics import HEALTH_RID_PREFIX
from tokenizer.native.spec import AbortBody

if TYPE_CHECKING:
    from tokenizer.server_state import ServerState

HEALTH_TIMEOUT_S = 20.0


async def health_generate(server: ServerState) -> bool:
    """Run a one-token greedy generation (an encoder: one embedding); True if it finished within
    the timeout.

    NOTE: the probe's rid starts with HEALTH_RID_PREFIX, which the metrics skip.
    """
    tm = server.accepting_manager()
    encoder = bool(tm.scheduler_info.get("encoder"))
    sampling = {"max_new_tokens": 0} if encoder else {"max_new_tokens": 1, "temperature": 0}
    prompt = PromptRequest([0], f"{HEALTH_RID_PREFIX}{uuid.uuid4().hex}", sampling, field="input_ids")
    updates = await generate(tm, GenRequest([prompt], embed=encoder))
    with server.track():
        async with contextlib.aclosing(updates):  # type: ignore[type-var]
            try:
                finished = await asyncio.wait_for(_finished(updates), HEALTH_TIMEOUT_S)
            except TimeoutError:
                return False
    return finished


async def _finished(updates: AsyncIterator[Update]) -> bool:
    done = False
    async for update in updates:
        done = done or update.finished is not None
    return done


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
    info.update(version=openapi.VERSION, status=server.phase.value, served_model_name=server.model_name,
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


async def abort_request(server: ServerState, body: Any, owner: str) -> dict[str, Any]:
    """/abort_request: `{"rid": str}` (its n>1 samples and a batch's prompts go too) or
    `{"abort_all": true}`, each over the caller's own requests only (`owner`)."""
    parsed = parse(AbortBody, body)
    tm = server.manager()
    if parsed.abort_all:
        await tm.abort_all(owner)
        return {"success": True, "abort_all": True}
    if parsed.rid is None:
        raise InvalidRequest.field("rid", "give rid (a non-empty string) or abort_all: true")
    await tm.abort(parsed.rid, owner)
    return {"success": True, "rid": parsed.rid}
