"""Chat templates: which names a request may set, and rendering off the event loop under a time
bound.

    text = await render_chat(tm, messages, tools, variables)        # the tokenizer's template
    text = await render_chat(tm, messages, tools, variables,        # a request's template, with
                             RequestTemplate(source, "chat_template"))  # the trust flag

Template variables are the names a template reads beyond `messages` and `tools` (flags such as
`enable_thinking`). A parameter of transformers' `apply_chat_template` is not one: `chat_template`
would run the caller's own Jinja in the server, `tokenize` / `return_dict` change what the call
returns, `tools` / `documents` would skip their validation. `reserved_names()` lists them all.

Where a render runs:
  - The tokenizer's own template (the operator's, trusted code): on a small thread pool. Its cost
    grows with the messages, which the body limit bounds; a render past the bound is answered with
    a 400 naming `messages` and the thread finishes on its own. Jinja is Python code that gives up
    the GIL every few milliseconds, so the event loop keeps serving meanwhile.
  - A request's template: untrusted Jinja. `{% for i in range(99999) %}{% for j in range(99999)
    %}` loops for hours, `9 ** 9 ** 9` is one C call that never returns to Python and `"x" *
    10**10` takes the machine's memory. No thread or sandboxed Jinja with a step budget can stop
    those (Jinja has no hook in a loop body, nor inside one arithmetic call), so it runs in a
    `KillableWorker` process under an address-space limit, killed when its answer is late;
    transformers' sandboxed renderer runs inside, as for the tokenizer's own template.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import os
import threading
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any, NamedTuple, Protocol

from runtime.contracts.errors import InvalidRequest, Overloaded
from runtime.support.worker_process import KillableWorker, serve
from tokenizer.core.json_bounds import lone_surrogate_at


class Templater(Protocol):
    """What rendering needs from the TokenizerManager (which imports this module)."""

    tokenizer: Any

    def apply_chat_template(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None,
                            **template_vars: Any) -> str: ...


RENDER_TIMEOUT_S = 5.0  # one render; typical ones take well under 10 ms
RENDER_THREADS = 2
SANDBOX_MEMORY_BYTES = 1 << 30  # what a request's template may allocate beyond the helper's own
MAX_RENDERED_CHARS = 16 * 1024 * 1024  # a request template's output (a prompt must fit the context)
ERROR_CHARS = 300

# The named parameters of transformers' `apply_chat_template` and of `render_jinja_template` beneath
# it, and `messages` (the conversation's name inside a template). `reserved_names()` adds those of
# the installed transformers, should a newer one have more.
RESERVED = frozenset({
    "self", "conversation", "conversations", "messages", "tools", "documents", "chat_template",
    "add_generation_prompt", "continue_final_message", "tokenize", "sanitize_control_tokens",
    "padding", "truncation", "max_length", "return_tensors", "return_dict",
    "return_assistant_tokens_mask", "tokenizer_kwargs",
})


@functools.cache
def reserved_names() -> frozenset[str]:
    """`RESERVED` and every named parameter of the installed transformers' renderers."""
    names = set(RESERVED)
    try:
        from transformers import PreTrainedTokenizerBase
        from transformers.utils.chat_template_utils import render_jinja_template
    except ImportError:
        return frozenset(names)
    for fn in (PreTrainedTokenizerBase.apply_chat_template, render_jinja_template):
        params = inspect.signature(fn).parameters.values()
        names.update(p.name for p in params if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD))
    return frozenset(names)


def check_template_vars(names: Iterable[str]) -> None:
    """Raise InvalidRequest for the first name that is not a template variable."""
    reserved = reserved_names()
    for name in names:
        if name in reserved:
            raise InvalidRequest(f"{name} is a parameter of apply_chat_template, not a template "
                                 "variable", param=name)


class RequestTemplate(NamedTuple):
    """A chat template sent by the client, and the body field it came in (for errors)."""

    source: str
    param: str


async def render_chat(tm: Templater, messages: list[dict[str, Any]],
                      tools: list[dict[str, Any]] | None, variables: dict[str, Any],
                      template: RequestTemplate | None = None,
                      timeout_s: float = RENDER_TIMEOUT_S) -> str:
    """The prompt text of a chat (generation prompt appended), rendered off the event loop.

    Raises:
        InvalidRequest: the template failed or ran past `timeout_s` (param: `messages` for the
            tokenizer's template, the template's field for a request's).
        Overloaded: the helper process for request templates cannot start.
    """
    if template is None:
        job = functools.partial(_render_own, tm, messages, tools, variables)
        return await _in_thread(job, timeout_s)
    tokens = dict(getattr(tm.tokenizer, "special_tokens_map", {}))
    sandbox_job = SandboxJob(template.source, messages, tools, {**tokens, **variables})
    return await default_sandbox().render(sandbox_job, template.param, timeout_s)


def clean_error(exc: BaseException | str) -> str:
    """An error's text, short and valid Unicode (it may quote what a client sent)."""
    text = str(exc).strip() or type(exc).__name__
    if len(text) > ERROR_CHARS:
        text = text[:ERROR_CHARS] + "..."
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


# ---------------------------------------------------------------- the tokenizer's own template

_POOL = ThreadPoolExecutor(max_workers=RENDER_THREADS, thread_name_prefix="chat-template")


async def _in_thread(job: Callable[[], str], timeout_s: float) -> str:
    future = asyncio.get_running_loop().run_in_executor(_POOL, job)
    try:
        return await asyncio.wait_for(future, timeout_s)
    except TimeoutError:  # NOTE: the thread runs on to its end; only the wait is bounded
        raise InvalidRequest(f"the chat template took longer than {timeout_s:g} s to render these "
                             "messages", param="messages") from None


def _render_own(tm: Templater, messages: list[dict[str, Any]],
                tools: list[dict[str, Any]] | None, variables: dict[str, Any]) -> str:
    try:
        text = tm.apply_chat_template(messages, tools=tools, **variables)
    except InvalidRequest:
        raise
    except Exception as exc:  # NOTE: client-controlled input rendered by a Jinja template
        raise InvalidRequest(f"the chat template cannot render these messages: {clean_error(exc)}",
                             param="messages") from None
    if lone_surrogate_at(text) is not None:  # the tokenizer raises TypeError on one
        raise InvalidRequest("the rendered prompt holds a lone surrogate", param="messages")
    return text


# ---------------------------------------------------------------- a request's template


@dataclass(frozen=True, slots=True)
class SandboxJob:
    """One render in the helper: all plain data (it is pickled through a pipe)."""

    source: str
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None
    variables: dict[str, Any]
    max_chars: int = MAX_RENDERED_CHARS


class TemplateSandbox:
    """Renders request templates in one killable helper process, one render at a time.

    A render gets `timeout_s` of the helper's time, and waits at most as long for its turn (the
    first one also waits for the helper to start: it imports transformers, 1-3 s).
    """

    def __init__(self, memory_bytes: int = SANDBOX_MEMORY_BYTES) -> None:
        self._lock = threading.Lock()
        self._worker = KillableWorker(_sandbox_main, memory_bytes, "chat-template")

    async def render(self, job: SandboxJob, param: str,
                     timeout_s: float = RENDER_TIMEOUT_S) -> str:
        """The rendered text; InvalidRequest naming `param` when the template fails or is late."""
        try:
            ok, text = await asyncio.to_thread(self._ask, job, timeout_s)
        except TimeoutError:
            raise InvalidRequest(f"{param} took longer than {timeout_s:g} s to render these "
                                 "messages", param=param) from None
        except EOFError:
            raise InvalidRequest(f"{param} crashed the template renderer", param=param) from None
        except (RuntimeError, OSError) as exc:  # not the template's fault
            why = clean_error(exc)
            raise Overloaded(f"request chat templates are unavailable: {why}") from None
        if not ok:
            raise InvalidRequest(f"{param} cannot render these messages: {text}", param=param)
        return text

    def close(self) -> None:
        """Stop the helper (the next render starts a new one)."""
        self._worker.kill()

    def _ask(self, job: SandboxJob, timeout_s: float) -> tuple[bool, str]:
        if not self._lock.acquire(timeout=timeout_s):
            raise TimeoutError
        try:
            return self._worker.ask(job, timeout_s)
        finally:
            self._lock.release()


_sandbox: TemplateSandbox | None = None
_sandbox_lock = threading.Lock()


def default_sandbox() -> TemplateSandbox:
    """The process-wide sandbox (its helper starts on the first request template)."""
    global _sandbox
    with _sandbox_lock:
        if _sandbox is None:
            _sandbox = TemplateSandbox()
        return _sandbox


def _sandbox_main(conn: Connection, memory_bytes: int) -> None:
    """The helper: transformers' renderer, a memory cap, then one answer per job."""
    from transformers.utils.chat_template_utils import render_jinja_template

    _limit_memory(memory_bytes)
    serve(conn, functools.partial(_render_job, render_jinja_template))


def _render_job(render: Callable[..., Any], job: SandboxJob) -> tuple[bool, str]:
    """(True, text) or (False, why)."""
    try:
        rendered, _ = render(conversations=[job.messages], tools=job.tools,
                             chat_template=job.source, add_generation_prompt=True, **job.variables)
        text = rendered[0]
    except MemoryError:
        return False, "it needs more memory than a template may use"
    except Exception as exc:  # noqa: BLE001  (any failure is the template's verdict)
        return False, clean_error(exc)
    if not isinstance(text, str) or len(text) > job.max_chars:
        return False, f"the rendered prompt is longer than {job.max_chars} characters"
    if lone_surrogate_at(text) is not None:
        return False, "the rendered prompt holds a lone surrogate"
    return True, text


def _limit_memory(extra_bytes: int) -> None:
    """Cap the helper's address space at what it maps now plus `extra_bytes`, so a template that
    builds a huge string gets MemoryError instead of the machine's memory (Linux only)."""
    import resource

    try:
        with open("/proc/self/statm") as fh:
            mapped = int(fh.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
        resource.setrlimit(resource.RLIMIT_AS, (mapped + extra_bytes, mapped + extra_bytes))
    except (OSError, ValueError):
        pass  # no /proc or no permission: the time bound still holds
