"""The /metrics names: SGLang's with our prefix, or SGLang's own with --metrics-prefix sglang,
read back with prometheus_client's parser."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from runtime.config import ServerConfig
from tokenizer.server_state import ServerState

# SGLang's names (sglang/srt/metrics/collector.py) that dashboards read; counters without _total,
# as the parser names their families.
SGLANG_NAMES = {
    "num_running_reqs": "gauge", "num_queue_reqs": "gauge", "num_used_tokens": "gauge", "token_usage": "gauge",
    "cache_hit_rate": "gauge", "gen_throughput": "gauge", "spec_accept_length": "gauge",
    "prompt_tokens": "counter", "generation_tokens": "counter", "cached_tokens": "counter",
    "num_requests": "counter", "num_aborted_requests": "counter", "num_retracted_requests": "counter",
    "time_to_first_token_seconds": "histogram", "inter_token_latency_seconds": "histogram",
    "e2e_request_latency_seconds": "histogram", "queue_time_seconds": "histogram",
}


def families(config: ServerConfig) -> dict[str, str]:
    state = ServerState(config)
    state.metrics.update_state({"running": 2, "waiting": 1, "kv_total": 100, "kv_available": 50,
                                "kv_evictable": 10, "retractions": 3})
    text = state.metrics.render().decode()
    return {f.name: f.type for f in text_string_to_metric_families(text)}


def test_sglang_prefix_gives_sglangs_names() -> None:
    got = families(ServerConfig(model_path="/models/m", metrics_prefix="sglang"))
    assert {f"sglang:{name}": kind for name, kind in SGLANG_NAMES.items()}.items() <= got.items()
    assert not any(name.startswith("radixserve:") for name in got)


def test_the_default_prefix_is_ours() -> None:
    got = families(ServerConfig(model_path="/models/m"))
    assert {f"radixserve:{name}": kind for name, kind in SGLANG_NAMES.items()}.items() <= got.items()
