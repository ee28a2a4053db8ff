"""The /metrics names: SGLang's with our prefix, or SGLang's own with --metrics-prefix sglang,
read back with prometheus_client's parser."""

from __future__ import annotations

from types import SimpleNamespace

from prometheus_client.parser import text_string_to_metric_families

from runtime.contracts.config import ServerConfig
from tokenizer.metrics import PRIORITY_LABEL_RANGE, priority_label
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


def test_priority_label_is_bounded() -> None:
    """Any 32-bit priority is accepted, but the `priority` label takes a fixed set of values:
    itself within +-PRIORITY_LABEL_RANGE, two shared labels beyond."""
    metrics = ServerState(ServerConfig(model_path="/models/m")).metrics
    priorities = [0, 1, -1, PRIORITY_LABEL_RANGE, -PRIORITY_LABEL_RANGE, *range(11, 2000, 7),
                  *range(-2000, -10, 13), 2**31 - 1, -(2**31)]
    for i, priority in enumerate(priorities):
        req = SimpleNamespace(priority=priority)
        state = SimpleNamespace(rid=f"r{i}", label=f"r{i}", req=req, completion_tokens=1, created=0.0,
                                queue_time=0.5, finished=False)
        metrics.observe_output(state, 0, 1.0)  # type: ignore[arg-type]
    text = metrics.render().decode()
    labels = {s.labels["priority"] for f in text_string_to_metric_families(text)
              if f.name == "radixserve:priority_queue_time_seconds" for s in f.samples}
    r = PRIORITY_LABEL_RANGE
    assert labels == {"0", "1", "-1", str(r), str(-r), f">{r}", f"<-{r}"}
    assert priority_label(r + 1) == f">{r}" and priority_label(-r - 1) == f"<-{r}" and priority_label(3) == "3"


def test_tier_totals_become_counters() -> None:
    state = ServerState(ServerConfig(model_path="/models/m"))
    state.metrics.update_state({"kv_total": 100, "tier_loaded_tokens": 640, "tier_loads_chosen": 3,
                                "tier_recomputes_chosen": 1, "tier_blocks": 20, "pinned_tokens": 32})
    state.metrics.update_state({"kv_total": 100, "tier_loaded_tokens": 700, "tier_loads_chosen": 4})
    samples = {s.name: s.value for f in text_string_to_metric_families(state.metrics.render().decode())
               for s in f.samples}
    assert samples["radixserve:kv_tier_loaded_tokens_total"] == 700
    assert samples["radixserve:kv_tier_loads_chosen_total"] == 4
    assert samples["radixserve:kv_tier_recomputes_chosen_total"] == 1
    assert samples["radixserve:kv_tier_blocks"] == 0  # a gauge: the last state had none
    assert samples["radixserve:kv_tier_misses_total"] == 0
