"""Prometheus metrics of one server, in its own `CollectorRegistry` (so tests can run several).

Names are SGLang's with our prefix (`radixserve:`; `--metrics-prefix sglang` gives SGLang's own
names, for its dashboards), each with a `model_name` label:

    gauges      num_running_reqs, num_queue_reqs, num_used_tokens, token_usage,
                cache_hit_rate, gen_throughput, spec_accept_length
    counters    prompt_tokens_total, generation_tokens_total, cached_tokens_total,
                num_requests_total{finish_reason}, num_aborted_requests_total,
                http_requests_total{method, route, status},
                num_rejected_requests_total{reason} (admission control: queue_full)
    histograms  time_to_first_token_seconds, inter_token_latency_seconds,
                e2e_request_latency_seconds, queue_time_seconds (waiting in the scheduler
                before the first forward), and per priority class (label `priority`, see
                `priority_label`; 0 without priority scheduling): priority_queue_time_seconds,
                priority_time_to_first_token_seconds
    counters from the scheduler's totals: num_retracted_requests_total (SGLang's; KV pressure and
                preemption), num_preempted_requests_total (for a more urgent request), and with a
                KV tier (--kv-tier-gb, --kv-store): kv_tier_{hits,misses,hit_tokens,loaded_tokens,
                loads_chosen,recomputes_chosen,bytes_read,bytes_written,corrupt_blocks}_total;
                gauges kv_tier_blocks (held) and kv_pinned_tokens (Anthropic cache_control pins)

Token counters and latencies come from the TokenizerManager's `on_output` hook
(`observe_output`); the gauges from the scheduler's state (`update_state`) at each scrape and each
periodic log tick. Warm-up copies of n>1 prompts and /health_generate probes are not counted.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from tokenizer.fanout import WARMUP_SUFFIX  # the prefill-only copies of n>1 prompts: not counted

if TYPE_CHECKING:
    from tokenizer.request_state import ReqState

logger = logging.getLogger("radixserve.metrics")

DEFAULT_PREFIX = "radixserve"  # --metrics-prefix sglang gives SGLang's exact names
CONTENT_TYPE = CONTENT_TYPE_LATEST
HEALTH_RID_PREFIX = "HEALTH_CHECK_"
TTFT_BUCKETS = (0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 120, 160)
ITL_BUCKETS = (0.002, 0.004, 0.006, 0.008, 0.01, 0.015, 0.02, 0.025, 0.03, 0.035, 0.04, 0.06,
               0.08, 0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8)
E2E_BUCKETS = (0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400, 800)
MAX_TRACKED = 4096  # prune the last-token times of vanished requests beyond this many
# Priorities in [-PRIORITY_LABEL_RANGE, PRIORITY_LABEL_RANGE] get a label each; beyond, two shared ones.
PRIORITY_LABEL_RANGE = 10


@dataclass(frozen=True, slots=True)
class Interval:
    """Activity since the previous `tick()`: for the periodic log line."""

    seconds: float
    generation_tokens: float
    gen_throughput: float
    cache_hit_rate: float  # cached / prompt tokens of the requests finished in the interval


class ServerMetrics:
    """All metrics of one server; `render()` is the /metrics body."""

    def __init__(self, model_name: str, prefix: str = DEFAULT_PREFIX) -> None:
        self.prefix = prefix + ":"
        disable_created_metrics()  # NOTE: process-wide; the `_created` series are noise here
        self.registry = CollectorRegistry()
        self.model_name = model_name
        self.running = self._gauge("num_running_reqs", "Requests running in the scheduler")
        self.queued = self._gauge("num_queue_reqs", "Requests waiting in the scheduler")
        self.used_tokens = self._gauge("num_used_tokens", "KV slots neither free nor evictable")
        self.token_usage = self._gauge("token_usage", "Fraction of the KV pool held")
        self.cache_hit_rate = self._gauge("cache_hit_rate", "Cached / prompt tokens since start")
        self.gen_throughput = self._gauge("gen_throughput", "Generated tokens/s, last interval")
        self.spec_accept_length = self._gauge("spec_accept_length", "Tokens per speculative verify step")
        self.prompt_tokens = self._counter("prompt_tokens", "Prompt tokens of finished requests")
        self.generation_tokens = self._counter("generation_tokens", "Generated tokens")
        self.cached_tokens = self._counter("cached_tokens", "Prompt tokens served from the cache")
        self.aborted = self._counter("num_aborted_requests", "Requests that ended aborted")
        self._requests = Counter(self.prefix + "num_requests", "Finished requests by finish reason",
                                 ["model_name", "finish_reason"], registry=self.registry)
        self._http = Counter(self.prefix + "http_requests", "HTTP requests by route and status",
                             ["method", "route", "status"], registry=self.registry)
        self._rejected = Counter(self.prefix + "num_rejected_requests", "Requests refused before queueing, by reason",
                                 ["model_name", "reason"], registry=self.registry)
        self.ttft = self._histogram("time_to_first_token_seconds", "Time to first token",
                                    TTFT_BUCKETS)
        self.itl = self._histogram("inter_token_latency_seconds", "Time per token after the first",
                                   ITL_BUCKETS)
        self.e2e = self._histogram("e2e_request_latency_seconds", "End-to-end latency", E2E_BUCKETS)
        self.queue_time = self._histogram("queue_time_seconds", "Time waiting in the scheduler before the first "
                                          "forward", TTFT_BUCKETS)
        by_priority = ["model_name", "priority"]
        self._priority_queue_time = Histogram(self.prefix + "priority_queue_time_seconds", "Queue time by priority",
                                              by_priority, buckets=TTFT_BUCKETS, registry=self.registry)
        self._priority_ttft = Histogram(self.prefix + "priority_time_to_first_token_seconds",
                                        "Time to first token by priority", by_priority, buckets=TTFT_BUCKETS,
                                        registry=self.registry)
        # Totals the scheduler counts, turned into counters by their growth at each update_state().
        self._scheduler_totals = {
            "retractions": self._counter("num_retracted_requests", "Requests retracted (KV pressure or preemption)"),
            "preemptions": self._counter("num_preempted_requests", "Requests retracted for a more urgent one"),
            **{f"tier_{name}": self._counter(f"kv_tier_{name}", doc) for name, doc in TIER_TOTALS.items()},
        }
        self.tier_blocks = self._gauge("kv_tier_blocks", "KV blocks held by the tier store")
        self.pinned_tokens = self._gauge("kv_pinned_tokens", "Prompt tokens pinned by cache_control")
        self._seen_totals = dict.fromkeys(self._scheduler_totals, 0)
        self._last_token_at: dict[str, tuple[ReqState, float]] = {}
        # NOTE: plain totals alongside the counters: prometheus_client has no public getter
        self.totals = {"generation": 0, "prompt": 0, "cached": 0}
        self._tick = (time.monotonic(), 0, 0, 0)  # (time, generation, prompt, cached)
        self.last_gen_throughput = 0.0  # tokens/s of the last closed interval (/get_server_info)

    def _gauge(self, name: str, doc: str) -> Any:
        gauge = Gauge(self.prefix + name, doc, ["model_name"], registry=self.registry)
        return gauge.labels(self.model_name)

    def _counter(self, name: str, doc: str) -> Any:
        counter = Counter(self.prefix + name, doc, ["model_name"], registry=self.registry)
        return counter.labels(self.model_name)

    def _histogram(self, name: str, doc: str, buckets: tuple[float, ...]) -> Any:
        hist = Histogram(self.prefix + name, doc, ["model_name"], buckets=buckets,
                         registry=self.registry)
        return hist.labels(self.model_name)

    # ------------------------------------------------------------ per request

    def observe_reject(self, reason: str) -> None:
        """The TokenizerManager's `on_reject` hook (admission control)."""
        self._rejected.labels(self.model_name, reason).inc()

    def tracked_requests(self) -> int:
        """Requests whose last token time is kept (for inter-token latency); 0 once idle."""
        return len(self._last_token_at)

    def observe_output(self, state: ReqState, before: int, now: float) -> None:
        """The TokenizerManager's `on_output` hook. NOTE: it runs inside the manager's receive
        loop, where an exception would fail every request, so it never raises."""
        try:
            self._observe(state, before, now)
        except Exception:
            logger.exception("metrics: observing an output failed")

    def _observe(self, state: ReqState, before: int, now: float) -> None:
        rid = state.rid  # internal: unique while live, unlike the client's label
        if rid.endswith(WARMUP_SUFFIX) or state.label.startswith(HEALTH_RID_PREFIX):
            return
        new = state.completion_tokens - before
        if new > 0:
            self.generation_tokens.inc(new)
            self.totals["generation"] += new
            last = self._last_token_at.get(rid)
            if before == 0 or last is None:
                self.ttft.observe(now - state.created)
                priority = priority_label(state.req.priority)
                self._priority_ttft.labels(self.model_name, priority).observe(now - state.created)
                if state.queue_time is not None:
                    self.queue_time.observe(state.queue_time)
                    self._priority_queue_time.labels(self.model_name, priority).observe(state.queue_time)
            else:
                gap = (now - last[1]) / new
                for _ in range(new):
                    self.itl.observe(gap)
            self._last_token_at[rid] = (state, now)
        if state.finished:
            self._last_token_at.pop(rid, None)
            self.prompt_tokens.inc(state.prompt_tokens)
            self.cached_tokens.inc(state.cached_tokens)
            self.totals["prompt"] += state.prompt_tokens
            self.totals["cached"] += state.cached_tokens
            end = state.finished_time if state.finished_time is not None else now
            self.e2e.observe(end - state.created)
            reason = (state.finish_reason or {}).get("type", "unknown")
            self._requests.labels(self.model_name, str(reason)).inc()
            if reason == "abort":
                self.aborted.inc()

    def prune(self, live: dict[str, ReqState]) -> None:
        """Forget requests that left the manager without finishing (aborted by their client)."""
        if len(self._last_token_at) > len(live):
            for rid in [r for r, (s, _) in self._last_token_at.items() if live.get(r) is not s]:
                del self._last_token_at[rid]

    def observe_http(self, method: str, route: str, status: int) -> None:
        self._http.labels(method, route, str(status)).inc()

    # ------------------------------------------------------------ gauges

    def update_state(self, state: dict[str, Any]) -> None:
        """Gauges from the scheduler's `get_state()` dict."""
        self.running.set(state.get("running", 0))
        self.queued.set(state.get("waiting", 0))
        self.used_tokens.set(kv_used(state))
        self.token_usage.set(kv_usage(state))
        self.spec_accept_length.set(state.get("spec_accept_length", 0.0))
        self.tier_blocks.set(state.get("tier_blocks", 0))
        self.pinned_tokens.set(state.get("pinned_tokens", 0))
        for key, counter in self._scheduler_totals.items():
            total = state.get(key, 0)
            if total > self._seen_totals[key]:
                counter.inc(total - self._seen_totals[key])
                self._seen_totals[key] = total
        prompt = self.totals["prompt"]
        self.cache_hit_rate.set(self.totals["cached"] / prompt if prompt else 0.0)

    def tick(self) -> Interval:
        """Close the current interval: sets gen_throughput and returns the interval's activity."""
        now = time.monotonic()
        gen, prompt, cached = (self.totals[k] for k in ("generation", "prompt", "cached"))
        then, gen0, prompt0, cached0 = self._tick
        self._tick = (now, gen, prompt, cached)
        seconds = max(now - then, 1e-9)
        throughput = (gen - gen0) / seconds
        self.gen_throughput.set(throughput)
        self.last_gen_throughput = throughput
        hit = (cached - cached0) / (prompt - prompt0) if prompt > prompt0 else 0.0
        return Interval(seconds, gen - gen0, throughput, hit)

    def render(self) -> bytes:
        return generate_latest(self.registry)


# The KV tier's totals (scheduler/kv_tier.py, scheduler/tier_costs.py), as counters.
TIER_TOTALS = {
    "hits": "Admissions whose prompt continued into the KV tier",
    "misses": "Admissions with whole blocks past the pool's prefix that the tier lacked",
    "hit_tokens": "Prompt tokens found in the KV tier",
    "loaded_tokens": "Prompt tokens loaded from the KV tier instead of computed",
    "loads_chosen": "Tier hits the cost model chose to load",
    "recomputes_chosen": "Tier hits the cost model chose to recompute",
    "bytes_read": "Bytes loaded from the KV tier",
    "bytes_written": "Bytes written to the KV tier",
    "corrupt_blocks": "Tier blocks dropped for a bad checksum or hash",
}


def priority_label(priority: int) -> str:
    """The `priority` label of a request: its value within +-PRIORITY_LABEL_RANGE, beyond that
    ">10" or "<-10" (for a range of 10). Any 32-bit integer is a valid priority, so a label per
    value would let clients create unbounded series; this keeps them to 2 * range + 3."""
    if priority > PRIORITY_LABEL_RANGE:
        return f">{PRIORITY_LABEL_RANGE}"
    if priority < -PRIORITY_LABEL_RANGE:
        return f"<-{PRIORITY_LABEL_RANGE}"
    return str(priority)


def kv_used(state: dict[str, Any]) -> int:
    """KV slots held by requests or pinned: neither free nor evictable (SGLang's lesson: a pool
    full of evictable cache is not "used")."""
    total = int(state.get("kv_total", 0))
    return total - int(state.get("kv_available", 0)) - int(state.get("kv_evictable", 0))


def kv_usage(state: dict[str, Any]) -> float:
    return kv_used(state) / max(int(state.get("kv_total", 0)), 1)
