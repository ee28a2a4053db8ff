"""Shared pytest setup: the `gpu`, `slow` and `ends_server` markers, the default model and the
run's shared servers.

- `@pytest.mark.gpu` tests are skipped when CUDA is absent. torch is imported only when such a
  test was collected, so the pure-Python suites (radix, detokenizer) stay fast.
- `@pytest.mark.slow` tests run by default; deselect them with `-m "not slow"`.
- `default_model_path` is the embedded SmolLM2-135M-Instruct folder, converted once per machine;
  `default_tokenizer`, `chat_ids` and `hf_greedy` are its tokenizer, the shared chat prompts and
  Hugging Face's greedy answers to them, each computed once per run (tests/chat_reference.py).

Servers: a real HTTP server costs 12-14 s to start on a 2-core machine, so modules that need the
same flags, or flags that do not conflict, share one (`server_pool`: one per fixture below, on
the default model with the test defaults `tests/tokenizer/http_helpers.BASE_ARGS` and the
fixture's flags, started on first use, stopped at the end of the run):

- `shared_server`: no other flags. Every test that needs no flag of its own uses it
  (test_bench_serving, test_hostile_chat_http, test_request_identity, the SGLang frontend).
  Tests leave it as they found it: healthy, idle, with its default settings.
- `small_server` (`http_helpers.SMALL_SERVER_ARGS`): 8 running + 2 queued requests, 128-token
  prefill chunks, the qwen3 reasoning parser, model name "smol", n <= 4, priority scheduling and
  a 4 s drain. Used by the soak (the small capacity gets it 503s; it asserts that it leaves
  nothing held), test_structured_outputs (the reasoning parser) and test_http_server (the name,
  priorities and the drain; its last test ends the server with SIGTERM).
- `shipped_server`: the configuration `make serve` gives, no flag at all (the shipped Q4_1
  file's blocks on our C++ kernels, the CPU's own dtype, all cores, the default pool). Used by
  tests/tokenizer/test_shipped_default_http.py.
- `key_server` (`http_helpers.KEY_SERVER_ARGS`): an API key read from a file (`http_helpers.AUTH`
  opens it), a 64 KiB body limit, 2 running + 1 queued requests, 4 prompts per request. Used by
  test_admission (admission control at that capacity: it fills it and empties it again, counting
  only its own 503s), test_browser_guard (the key file and the browser checks end to end) and
  test_http_errors (its last test kills the server's scheduler).

Tests of one module that use such a server leave it idle and sound, and compare counters the
server accumulates (forward counts, deadlines, 503s) before and after their own requests.
The modules that share `small_server` or `key_server` run one after the other (the collected
order is regrouped at the place of the group's first module: the soak pulls test_structured_outputs
and test_http_server forward to just after it), so that each lives only while its group runs; a
test marked `ends_server` (it stops or kills the server) puts its module last in its group. A
module that asks for a server a test ended gets a fresh one (a run with another order or a
subset is only slower).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from tests.chat_reference import HFGreedy
    from tests.tokenizer.http_helpers import RunningServer

GROUPED = ("small_server", "key_server")  # pooled servers whose users run one after another
SHIPPED = ("<shipped>",)  # ServerPool's key of the flagless server


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "ends_server: the test stops or kills its shared server (runs last of the server's group)")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    items[:] = _grouped_by_server(items)
    gpu_items = [item for item in items if item.get_closest_marker("gpu") is not None]
    if not gpu_items or _cuda_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in gpu_items:
        item.add_marker(skip)


def _grouped_by_server(items: list[pytest.Item]) -> list[pytest.Item]:
    """`items` with the modules that use one GROUPED server moved together, to the place of the
    first of them; within a group, modules with an `ends_server` test come last. Everything else
    keeps its order."""
    modules: dict[pytest.Item | pytest.Module, list[pytest.Item]] = {}
    for item in items:
        modules.setdefault(item.getparent(pytest.Module) or item, []).append(item)
    server = {module: _grouped_server(its) for module, its in modules.items()}
    out: list[pytest.Item] = []
    placed: set[str] = set()
    for module, its in modules.items():
        name = server[module]
        if name is None:
            out += its
        elif name not in placed:
            placed.add(name)
            group = [m for m in modules if server[m] == name]
            for member in sorted(group, key=lambda m: any(i.get_closest_marker("ends_server") for i in modules[m])):
                out += modules[member]
    return out


def _grouped_server(items: list[pytest.Item]) -> str | None:
    """The GROUPED server a module's tests use (None when none)."""
    names = {name for item in items for name in GROUPED if name in getattr(item, "fixturenames", ())}
    assert len(names) <= 1, f"a module uses two grouped servers: {names}"
    return names.pop() if names else None


@pytest.fixture(scope="session")
def default_model_path() -> str:
    """Path of the default model's Hugging Face folder (converted on first use, ~30 s)."""
    from runtime.support.default_model import ensure_default_model

    return ensure_default_model()


@pytest.fixture(scope="session")
def default_tokenizer(default_model_path: str) -> Any:
    """The default model's HF tokenizer (read-only use: tests must not change its settings)."""
    import transformers

    return transformers.AutoTokenizer.from_pretrained(default_model_path)


@pytest.fixture(scope="session")
def chat_ids(default_tokenizer: Any) -> list[list[int]]:
    """`chat_reference.QUESTIONS` as chat-template token ids. Tests must not mutate the lists."""
    from tests import chat_reference

    return chat_reference.chat_ids(default_tokenizer)


@pytest.fixture(scope="session")
def hf_greedy(default_model_path: str, chat_ids: list[list[int]]) -> HFGreedy:
    """HF's fp32 greedy answers to `chat_ids` (`.first(n)`), each computed once per run. The HF
    model stays loaded (about 0.5 GB) until every answer is known, so a later module's prompts
    cost no second load."""
    from tests.chat_reference import HFGreedy

    return HFGreedy(default_model_path, chat_ids)


class ServerPool:
    """The run's shared servers by flags: each started on first use, and again when asked for
    after a test ended it; all stopped at the end of the run."""

    def __init__(self, model_path: str) -> None:
        self.model_path = model_path
        self._servers: dict[tuple[str, ...], RunningServer] = {}

    def get(self, *extra: str) -> RunningServer:
        """The live server with BASE_ARGS and `extra`."""
        from tests.tokenizer.http_helpers import RunningServer

        return self._live(extra, lambda: RunningServer.start(self.model_path, *extra))

    def get_shipped(self) -> RunningServer:
        """The live server with no flags at all, on the shipped default model."""
        from tests.tokenizer.http_helpers import RunningServer

        return self._live(SHIPPED, lambda: RunningServer.start(None, base_args=()))

    def _live(self, key: tuple[str, ...], start: Callable[[], RunningServer]) -> RunningServer:
        server = self._servers.get(key)
        if server is None or server.process.poll() is not None:
            server = self._servers[key] = start()
        return server

    def stop_all(self) -> None:
        """SIGTERM to all first, so that they shut down side by side."""
        for server in self._servers.values():
            server.terminate()
        for server in self._servers.values():
            server.wait_stopped()


@pytest.fixture(scope="session")
def kquant_mix_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The default model as a K-quant mix .gguf (tests/runtime/execution/kquant_mix.py), written
    once per run (about 10 s)."""
    from runtime.support.default_model import gguf_path
    from tests.runtime.execution.kquant_mix import write_kquant_mix

    return write_kquant_mix(gguf_path(), tmp_path_factory.mktemp("kquant") / "mix.gguf")


@pytest.fixture(scope="session")
def server_pool(default_model_path: str) -> Iterator[ServerPool]:
    pool = ServerPool(default_model_path)
    try:
        yield pool
    finally:
        pool.stop_all()


@pytest.fixture(scope="session")
def shared_server(server_pool: ServerPool) -> RunningServer:
    """The run's one default server (never ended by a test)."""
    return server_pool.get()


@pytest.fixture(scope="session")
def shipped_server(server_pool: ServerPool) -> RunningServer:
    """The server as a user starts it: no flags (never ended by a test)."""
    return server_pool.get_shipped()


@pytest.fixture(scope="session")
def api_key_file(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A 0600 file holding `http_helpers.API_KEY`, for `key_server`'s --api-key-file."""
    from tests.tokenizer.http_helpers import API_KEY

    path = tmp_path_factory.mktemp("api-key") / "key"
    path.write_text(API_KEY + "\n")
    path.chmod(0o600)
    return str(path)


@pytest.fixture(scope="module")
def key_server(server_pool: ServerPool, api_key_file: str) -> RunningServer:
    """The API-key server (see the module docstring); module-scoped, so that a module after the
    one that ended it gets a fresh one."""
    from tests.tokenizer.http_helpers import KEY_SERVER_ARGS

    return server_pool.get("--api-key-file", api_key_file, *KEY_SERVER_ARGS)


@pytest.fixture(scope="module")
def small_server(server_pool: ServerPool) -> RunningServer:
    """The small-capacity server (see the module docstring); module-scoped like `key_server`."""
    from tests.tokenizer.http_helpers import SMALL_SERVER_ARGS

    return server_pool.get(*SMALL_SERVER_ARGS)
