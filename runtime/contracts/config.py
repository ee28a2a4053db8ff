"""The one server configuration: a frozen dataclass, the CLI generated from its fields.

`ServerConfig` is built once from the command line (or `Engine(**kwargs)`), then `resolve()` turns
every "auto" value into a concrete one and returns a *new* frozen object. Nothing mutates a config
after that; per-process variants are made with `dataclasses.replace`.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
from dataclasses import dataclass, field, fields
from typing import Any, get_args, get_origin, get_type_hints

from runtime.contracts.errors import InvalidRequest


def _opt(default: Any, help: str, choices: tuple[str, ...] | None = None, secret: bool = False) -> Any:
    """A config field with one line of CLI help (and optional choices / secrecy)."""
    meta = {"help": help, "choices": choices, "secret": secret}
    return field(default=default, metadata=meta)


# The pages served from this machine, on any port: what a browser may call a local server from.
LOOPBACK_ORIGINS = tuple(f"{scheme}://{host}:*" for scheme in ("http", "https")
                         for host in ("localhost", "127.0.0.1", "[::1]"))
_ORIGIN_ENTRY = re.compile(r"\*|[a-z][a-z0-9+.-]*://(\[[0-9a-f:.]+\]|[^/?#@\s:\[\]]+)(:(\d+|\*))?", re.I)


@dataclass(frozen=True)
class ServerConfig:
    """Every knob of a radixserve launch. Field names are the CLI names with underscores."""

    # Model.
    model_path: str | None = _opt(
        None, "Hugging Face model folder or a .gguf file; default: the embedded SmolLM2-135M-Instruct")
    tokenizer_path: str | None = _opt(None, "tokenizer folder; default: the model folder")
    load_format: str = _opt(
        "auto", "how to load weights: auto (safetensors; a .gguf model_path is dequantized once into a cached "
        "folder), gguf (on CPU a .gguf's q8_0/q4_0/q4_1 linears run from their blocks by our kernels, with no "
        "full-precision copy, config and tokenizer from its metadata; elsewhere its dequantized folder), or "
        "random dummy weights", ("auto", "gguf", "dummy"))
    gguf_file: str | None = _opt(
        None, "the .gguf whose blocks load_format gguf runs; set from a .gguf model_path (model_path then names "
        "the folder with its config and tokenizer, read from the file's metadata)")
    dtype: str = _opt(
        "auto", "weight and activation dtype; auto: on CPU bfloat16 where the CPU computes it natively "
        "(AVX-512 BF16 or AMX), float32 elsewhere; on CUDA the checkpoint's dtype (float32 ones run in bfloat16)",
        ("auto", "float32", "bfloat16", "float16"))
    quantization: str = _opt(
        "none", "weight-only quantization at load (CPU): q8_0, q4_0 or q4_1 turn the decoder's linears into GGUF's "
        "blocks (the head into q8_0) run by our kernels, with no full-precision copy; int8 adds per-channel int8 "
        "weights beside the full-precision ones for small-batch decode steps",
        ("none", "int8", "q8_0", "q4_0", "q4_1"))
    kv_cache_dtype: str = _opt(
        "auto", "KV cache dtype; auto: the model dtype", ("auto", "float32", "bfloat16", "float16"))
    context_length: int | None = _opt(None, "maximum tokens per request (prompt + output); default: the model's")
    served_model_name: str | None = _opt(None, "model name reported by the API; default: the model folder name")
    random_seed: int = _opt(0, "seed for dummy weights and for sampling without a per-request seed")

    # Hardware.
    device: str = _opt("auto", "compute device; auto: cuda when present, else cpu", ("auto", "cpu", "cuda"))
    attention_backend: str = _opt(
        "auto", "attention kernels; auto: flashinfer on CUDA, torch on CPU", ("auto", "torch", "flashinfer"))
    num_threads: int | None = _opt(
        None, "CPU threads for torch in each scheduler process; default: all cores, shared out among the tensor-"
        "parallel ranks")
    tp_size: int = _opt(
        1, "tensor-parallel ranks: one scheduler process per rank, each holding its share of the heads, the MLP "
        "and the vocabulary (gloo on CPU, NCCL on CUDA, one GPU per rank)")
    mem_fraction_static: float = _opt(0.85, "CUDA only: fraction of GPU memory for weights and KV cache")

    # Memory and scheduling.
    max_total_tokens: int | None = _opt(
        None, "KV cache capacity in tokens; default: from free GPU memory, or 65536 on CPU")
    max_running_requests: int | None = _opt(None, "most requests decoding at once; default: from the KV capacity")
    max_prefill_tokens: int = _opt(16384, "most new prompt tokens in one prefill batch")
    max_queued_requests: int = _opt(
        1024, "most requests admitted beyond --max-running-requests (waiting in the queue); more get 503 with "
        "Retry-After")
    request_timeout: float | None = _opt(
        None, "seconds a request may take from arrival to its end (a body's top-level `timeout` overrides it); "
        "past it, it ends with finish_reason abort; default: no deadline")
    max_prompts_per_request: int = _opt(256, "most prompts in one /generate or /v1/completions batch (400 above)")
    chunked_prefill_size: int | None = _opt(
        None, "most new prompt tokens per step, a prompt longer than that is prefilled in chunks (-1 disables "
        "chunking); default: 2048, as vLLM-CPU and SGLang")
    page_size: int = _opt(1, "tokens per KV page")
    schedule_policy: str = _opt("fcfs", "order of the waiting queue", ("fcfs", "lpm", "dfs-weight"))
    enable_priority_scheduling: bool = _opt(
        False, "order the waiting queue by each request's `priority` (larger first), then by the policy, and let "
        "an urgent arrival preempt less urgent running requests (retracted, they resume later)")
    schedule_low_priority_values_first: bool = _opt(False, "with priority scheduling: smaller `priority` values first")
    priority_scheduling_preemption_threshold: int = _opt(
        10, "with priority scheduling: how much more urgent an arrival must be to preempt a running request")
    priority_aging_timeout: float = _opt(
        30.0, "with priority scheduling: seconds after which a waiting request goes ahead of every priority, "
        "so none starves; 0: never")
    disable_radix_cache: bool = _opt(False, "turn off prefix reuse across requests")
    kv_tier_gb: float = _opt(
        0.0, "size in GB of the second KV tier behind the radix cache: KV the pool evicts is kept there and loaded "
        "back when that is cheaper than recomputing it (host memory; with --kv-store a file in that folder); "
        "0: no tier, or 4 GB when --kv-store is given")
    kv_store: str | None = _opt(
        None, "folder of the persistent KV tier: the tier lives in a memory-mapped file there and serves cached "
        "prefixes again after a restart of the same model; /flush_cache empties it")
    kv_block_size: int = _opt(
        32, "tokens per block of the KV tier and of --kv-events (a multiple of page_size); blocks are keyed by a "
        "chained hash of their tokens")
    kv_events: str | None = _opt(
        None, "publish the KV cache's block stored / removed / cleared events in vLLM's schema (msgpack "
        "EventBatch) on this ZMQ PUB endpoint, e.g. tcp://127.0.0.1:5557")
    kv_events_replay: str | None = _opt(
        None, "with --kv-events: a ZMQ ROUTER endpoint that replays buffered event batches from a sequence number")
    kv_pin_max_fraction: float = _opt(
        0.25, "most of the KV pool that prompts pinned by Anthropic cache_control breakpoints may hold; pins "
        "beyond it are not made (and not reported as cache writes)")
    enable_batch_variance: bool = _opt(
        False, "let a row's result depend on what it is batched with, for speed: decode rows sharing a long KV "
        "prefix attend to it once (the cascade) and engines are chosen by batch shape (the start-up log says "
        "which); greedy tokens may then change with batching, chunking and the cache")
    disable_overlap_schedule: bool | None = _opt(
        None, "run the scheduler and the forward one after the other; default: overlap on CUDA only, "
        "where it measures faster (on CPU the forward thread competes for the cores)")
    enable_mixed_chunk: bool | None = _opt(
        None, "run the running requests' decode step in the same forward as a prefill chunk, so new "
        "prompts do not stall running streams; default: on on CPU, off on CUDA (as SGLang)")
    speculative_algorithm: str = _opt(
        "none", "speculative decoding: ngram drafts tokens from the request's own prompt and output (no draft "
        "model) and the model verifies them in one forward; greedy outputs stay identical and sampled ones keep "
        "their distribution; it turns the overlap loop off", ("none", "ngram"))
    speculative_num_draft_tokens: int = _opt(4, "with speculative decoding: most draft tokens verified per step")
    speculative_disable_by_batch_size: int = _opt(
        4, "with speculative decoding: decode plainly while more requests than this are running (a large batch "
        "is compute-bound: rejected drafts are wasted work; measured in docs/benchmarks.md)")
    speculative_ngram_min_match_window_size: int = _opt(1, "ngram: the shortest suffix looked up")
    speculative_ngram_max_match_window_size: int = _opt(3, "ngram: the longest suffix looked up (tried first)")
    disable_cuda_graph: bool = _opt(False, "CUDA only: run decode steps eagerly instead of replaying captured graphs")
    cuda_graph_max_bs: int | None = _opt(
        None, "CUDA only: the largest decode batch run by a captured graph (buckets 1, 2, 4, 8, then every 8); "
        "default by GPU memory as SGLang (256 on 90-160 GB GPUs)")
    stream_interval: int = _opt(
        1, "send a streamed request's new tokens every N tokens (its first token and its finish at once); "
        "a request's own sampling_params.stream_interval overrides it")

    # Server.
    host: str = _opt(
        "127.0.0.1", "HTTP host to bind; on a loopback address (127.x, ::1, localhost) a request whose Host header is "
        "not a loopback name gets 403 (DNS rebinding); on 0.0.0.0 or another address Host is not checked")
    port: int = _opt(30000, "HTTP port to bind")
    api_key: str | None = _opt(
        None, "require this key as 'Authorization: Bearer <key>' (all routes but /health); visible to other local "
        "users in the process list: prefer --api-key-file or RADIXSERVE_API_KEY (this flag wins, then the file, "
        "then the variable)", secret=True)
    api_key_file: str | None = _opt(None, "read the API key from this file (its content, whitespace stripped)")
    allowed_origins: tuple[str, ...] = _opt(
        LOOPBACK_ORIGINS, "web pages (their Origin) that may call the server, answered with CORS headers; others "
        "get 403: scheme://host[:port], port * for any, or * for every page (Origin null included)")
    max_request_bytes: int = _opt(8 * 1024 * 1024, "largest accepted HTTP body in bytes (413 above)")
    max_n: int = _opt(16, "largest accepted n (parallel samples per prompt)")
    max_top_logprobs: int = _opt(20, "largest accepted top_logprobs / top_logprobs_num")
    log_level: str = _opt("info", "logging level", ("debug", "info", "warning", "error"))
    reasoning_parser: str = _opt(
        "none", "split a chat answer's thinking into reasoning_content: qwen3 (<think>...</think>) or deepseek-r1 "
        "(the template opens <think>)", ("none", "qwen3", "deepseek-r1"))
    tool_call_parser: str = _opt(
        "auto", "the tool-call format chat outputs are parsed for: hermes / qwen25 (<tool_call> blocks), llama3 "
        "(bare JSON calls, ';'-separated), auto (<tool_call> blocks, else bare JSON)",
        ("auto", "hermes", "qwen25", "llama3"))
    trust_request_chat_template: bool = _opt(
        False, "let a chat request bring its own Jinja chat template (`chat_template`, top level or in "
        "chat_template_kwargs), rendered in a killable helper process; off: a 400 naming the field")
    metrics_prefix: str = _opt(
        "radixserve", "the prefix of every /metrics name; sglang gives SGLang's exact names (its dashboards work)",
        ("radixserve", "sglang"))
    watchdog_timeout: float = _opt(
        300.0, "seconds the scheduler may go without finishing a loop iteration (a stuck forward) before it "
        "reports, fails every request and exits non-zero; 0 turns the watchdog off")
    drain_timeout: float = _opt(
        30.0, "seconds in-flight requests get to finish after SIGTERM/SIGINT before they are aborted")
    # /v1/responses keeps stored responses (store: true) in memory, least recently used out first.
    responses_store_max_count: int = _opt(
        1024, "most responses /v1/responses keeps for previous_response_id and GET (LRU beyond it); 0 stores none")
    responses_store_max_bytes: int = _opt(
        64 * 1024 * 1024, "most bytes (their JSON) the stored /v1/responses responses and histories may hold (LRU)")
    responses_store_ttl: float = _opt(
        3600.0, "seconds a stored /v1/responses response lives after its last use")

    def __post_init__(self) -> None:
        for f in fields(self):
            choices = f.metadata.get("choices")
            value = getattr(self, f.name)
            if choices and value not in choices:
                raise InvalidRequest(f"{f.name} must be one of {list(choices)}, got {value!r}", param=f.name)
        if self.speculative_num_draft_tokens < 1:
            raise InvalidRequest("speculative_num_draft_tokens must be >= 1", param="speculative_num_draft_tokens")
        if not 1 <= self.speculative_ngram_min_match_window_size <= self.speculative_ngram_max_match_window_size:
            raise InvalidRequest("the ngram match windows need 1 <= min <= max",
                                 param="speculative_ngram_min_match_window_size")
        if self.tp_size < 1:
            raise InvalidRequest("tp_size must be >= 1", param="tp_size")
        if self.page_size < 1:
            raise InvalidRequest("page_size must be >= 1", param="page_size")
        if self.kv_block_size < 1 or self.kv_block_size % self.page_size:
            raise InvalidRequest("kv_block_size must be a positive multiple of page_size", param="kv_block_size")
        if not self.kv_tier_gb >= 0:
            raise InvalidRequest("kv_tier_gb must be >= 0", param="kv_tier_gb")
        if not 0 <= self.kv_pin_max_fraction <= 1:
            raise InvalidRequest("kv_pin_max_fraction must be in [0, 1]", param="kv_pin_max_fraction")
        if self.kv_tier_bytes and self.disable_radix_cache:
            raise InvalidRequest("the KV tier keeps what the radix cache evicts: it needs the radix cache",
                                 param="kv_tier_gb")
        if self.kv_tier_bytes and self.tp_size > 1:
            raise InvalidRequest("the KV tier does not support tensor parallelism yet", param="kv_tier_gb")
        if self.kv_events_replay and not self.kv_events:
            raise InvalidRequest("kv_events_replay needs kv_events", param="kv_events_replay")
        if self.stream_interval < 1:
            raise InvalidRequest("stream_interval must be >= 1", param="stream_interval")
        for name in ("max_queued_requests", "max_prompts_per_request"):
            if getattr(self, name) < 1:
                raise InvalidRequest(f"{name} must be >= 1", param=name)
        if self.request_timeout is not None and not self.request_timeout > 0:
            raise InvalidRequest("request_timeout must be > 0 seconds", param="request_timeout")
        if not self.priority_aging_timeout >= 0:
            raise InvalidRequest("priority_aging_timeout must be >= 0 seconds", param="priority_aging_timeout")
        if not self.watchdog_timeout >= 0:
            raise InvalidRequest("watchdog_timeout must be >= 0 seconds", param="watchdog_timeout")
        if not self.drain_timeout >= 0:
            raise InvalidRequest("drain_timeout must be >= 0 seconds", param="drain_timeout")
        for name in ("responses_store_max_count", "responses_store_max_bytes"):
            if getattr(self, name) < 0:
                raise InvalidRequest(f"{name} must be >= 0", param=name)
        if not self.responses_store_ttl > 0:
            raise InvalidRequest("responses_store_ttl must be > 0 seconds", param="responses_store_ttl")
        if self.cuda_graph_max_bs is not None and self.cuda_graph_max_bs < 1:
            raise InvalidRequest("cuda_graph_max_bs must be >= 1", param="cuda_graph_max_bs")
        bad = [o for o in self.allowed_origins if not (isinstance(o, str) and _ORIGIN_ENTRY.fullmatch(o))]
        if bad or isinstance(self.allowed_origins, str):
            raise InvalidRequest(f"allowed_origins must be a list of '*' or scheme://host[:port] (port * for any, "
                                 f"no path), got {bad or self.allowed_origins!r}", param="allowed_origins")

    @property
    def kv_tier_bytes(self) -> int:
        """Bytes of the KV tier: --kv-tier-gb, or 4 GB for --kv-store alone; 0: no tier."""
        gb = self.kv_tier_gb or (4.0 if self.kv_store else 0.0)
        return int(gb * 2**30)

    def public_dict(self) -> dict[str, Any]:
        """The config without secrets (for /get_server_info and logs)."""
        return {f.name: getattr(self, f.name) for f in fields(self) if not f.metadata.get("secret")}

    def replace(self, **changes: Any) -> ServerConfig:
        return dataclasses.replace(self, **changes)


def _cli_type(annotation: Any) -> Any:
    """Map a field annotation (a string under postponed evaluation) to an argparse type."""
    args = [a for a in get_args(annotation) if a is not type(None)]
    base = args[0] if args else annotation
    if base is bool:
        return bool
    return base if base in (int, float, str) else str


def add_cli_arguments(parser: argparse.ArgumentParser) -> None:
    """One `--flag-name` per ServerConfig field, with its default and help line."""
    hints = get_type_hints(ServerConfig)
    for f in fields(ServerConfig):
        flag = "--" + f.name.replace("_", "-")
        typ = _cli_type(hints[f.name])
        default = " ".join(f.default) if isinstance(f.default, tuple) else f.default
        help_text = f"{f.metadata['help']} (default: {default})"
        if get_origin(hints[f.name]) is tuple:  # a list flag: `--flag A B`; a bare `--flag` is empty
            parser.add_argument(flag, dest=f.name, nargs="*", type=str, default=f.default, help=help_text)
        elif typ is bool and f.default is None:  # tri-state: unset means "decided at resolve time"
            parser.add_argument(flag, dest=f.name, action=argparse.BooleanOptionalAction,
                                default=None, help=help_text)
        elif typ is bool:
            parser.add_argument(flag, dest=f.name, action="store_true", default=f.default, help=help_text)
        else:
            parser.add_argument(flag, dest=f.name, type=typ, default=f.default,
                                choices=f.metadata.get("choices"), help=help_text)


def config_from_args(args: argparse.Namespace) -> ServerConfig:
    names = {f.name for f in fields(ServerConfig)}
    # argparse's Namespace is untyped; add_cli_arguments gave each flag its field's type.
    values: dict[str, Any] = {k: tuple(v) if isinstance(v, list) else v for k, v in vars(args).items() if k in names}
    return ServerConfig(**values)


def config_from_kwargs(model_path: str | None = None, **kwargs: Any) -> ServerConfig:
    """Build a config from Python keywords, rejecting unknown names with the list of known ones."""
    names = {f.name for f in fields(ServerConfig)}
    unknown = sorted(set(kwargs) - names)
    if unknown:
        raise TypeError(f"unknown config option(s) {unknown}; known: {sorted(names)}")
    return ServerConfig(model_path=model_path, **kwargs)


def read_model_json(model_path: str, name: str) -> dict[str, Any]:
    """Read a JSON file (config.json, generation_config.json) from a model folder; {} if absent."""
    path = os.path.join(model_path, name)
    if not os.path.exists(path):
        return {}
    with open(path) as fh:
        data: dict[str, Any] = json.load(fh)
    return data

