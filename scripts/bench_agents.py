"""Multi-turn agent benchmark: the workload radixserve exists for.

    .venv/bin/python scripts/bench_agents.py --base-url http://127.0.0.1:30000 --mode chat \\
        --agents 8 --turns 4 --output-file results/bench_agents.jsonl
    .venv/bin/python scripts/bench_agents.py --sessions 64 --concurrency 4 --history-tokens 3000 \\
        --turns 4 --phase first --state-file /tmp/agents.json    # then restart the server, and
    .venv/bin/python scripts/bench_agents.py ... --phase rest --state-file /tmp/agents.json

Every session's conversation starts with the same system prompt (a "tool manual" of about
`--system-words` words, shared by all sessions, so a prefix cache can serve it to everyone) and a
task of its own; each turn streams one answer of `--max-tokens` tokens (greedy, `ignore_eos`
where the server takes it), then appends a "tool result" of about `--tool-result-words` words, as
an agent does after calling a tool. `--history-tokens N` lengthens the task so that a session's
last prompt is about N tokens (at one token per word, which these words are in the SmolLM2 and
Llama tokenizers; the usage numbers have the real counts).

Schedules:
  - `--agents N`: N sessions all at once, each sending its next turn as soon as its answer ends.
  - `--sessions N --concurrency C`: round r is every session's turn r, its sessions in an order
    shuffled by `--seed`; at most C turns are in flight, and a free worker starts the first ready
    turn in that order (a session's turn is ready once its previous one answered), so rounds
    overlap only at their edges. With N sessions of H tokens beyond a server's KV pool, a session
    comes back after its history was evicted: what the server does then is what this measures.
Phases: `--phase first` runs turns 1..K (`--split-turn K`) and saves every session's conversation
to `--state-file`; `--phase rest` loads it and runs turns K+1..`--turns`, so a wrapper can restart
the server in between (scripts/bench_tier.sh).

Modes:
  - `chat`: POST /v1/chat/completions, resending the whole history each turn (what every
    OpenAI-compatible server takes: vLLM, llama.cpp, SGLang, radixserve).
  - `responses`: POST /v1/responses with `previous_response_id`, sending only the new items
    each turn (the server keeps the conversation).

Per turn it reports TTFT p50/p99 (to the first streamed text), the share of prompt tokens the
server reports as cached (`usage.prompt_tokens_details.cached_tokens`, or the Responses API's
`input_tokens_details.cached_tokens`; a server that reports none shows "-"), and output tokens
per second (the turn's output tokens over the span from its first request to its last answer);
then the same for the returning turns (every turn after a session's first) taken together.
Ratios are against the first turn of the run. Where the server answers /get_server_info with
radixserve's scheduler state, its KV tier counters are read before the run, after each round and
at the end. The run's numbers are appended as one JSON line to `--output-file`
(scripts/plot_benchmarks.py --agents reads it). Only loopback servers are accepted.
"""

from __future__ import annotations

import argparse
import asyncio
import heapq
import json
import random
import statistics
import sys
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlparse

import aiohttp

LOOPBACK = {"127.0.0.1", "localhost", "::1"}
WORDS = ("tool call input output schema field value agent file path line search read write list "
         "result error status retry limit token cache query index table row column page step plan "
         "check test build run deploy log trace metric span event queue worker task job batch").split()
# radixserve's scheduler counters kept from /get_server_info (the rest describe the pool's load).
STATE_KEYS = ("evicted_tokens", "kv_total", "retractions")


@dataclass
class Turn:
    """One streamed answer."""

    agent: int
    turn: int
    start: float = 0.0
    ttft: float | None = None
    end: float = 0.0
    prompt_tokens: int = 0
    cached_tokens: int | None = None
    output_tokens: int = 0
    text: str = ""
    error: str | None = None


@dataclass
class Agent:
    """One session: its conversation so far, which `--state-file` carries between phases."""

    index: int
    messages: list[dict[str, str]] = field(default_factory=list)
    previous_id: str | None = None
    done: int = 0  # turns answered


def words(rng: random.Random, count: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(count))


def system_prompt(count: int) -> str:
    """The shared tool manual: the same text for every agent (seeded once)."""
    return "You are a coding agent. Tool manual: " + words(random.Random(0), count)


def task_words(args: argparse.Namespace) -> int:
    """The task's length: --task-words, or longer so that the last turn's prompt is about
    --history-tokens (each later turn adds an answer and a tool result; ~10 template tokens a message)."""
    later = (args.turns - 1) * (args.max_tokens + args.tool_result_words + 20)
    return max(args.task_words, args.history_tokens - args.system_words - later - 20)


def new_items(args: argparse.Namespace, system: str, agent: int, turn: int) -> list[dict[str, str]]:
    """What turn `turn` of session `agent` adds to its conversation: the same text in every phase."""
    rng = random.Random(f"{args.seed}/{agent}/{turn}")
    if turn == 0:
        return [{"role": "system", "content": system},
                {"role": "user", "content": f"Task {agent}: " + words(rng, task_words(args))}]
    return [{"role": "user", "content": "Tool result: " + words(rng, args.tool_result_words)}]


async def sse_events(resp: aiohttp.ClientResponse) -> Any:
    """The JSON payload of each `data:` line of a server-sent event stream."""
    async for raw in resp.content:
        line = raw.decode("utf-8", "replace").strip()
        if line.startswith("data:") and line[5:].strip() != "[DONE]":
            yield json.loads(line[5:].strip())


async def chat_turn(session: aiohttp.ClientSession, url: str, model: str, agent: Agent, turn: Turn,
                    max_tokens: int) -> None:
    body = {"model": model, "messages": agent.messages, "max_tokens": max_tokens, "temperature": 0,
            "stream": True, "stream_options": {"include_usage": True}, "ignore_eos": True}
    async with session.post(f"{url}/v1/chat/completions", json=body) as resp:
        if resp.status != 200:
            turn.error = f"{resp.status}: {(await resp.text())[:200]}"
            return
        async for event in sse_events(resp):
            for choice in event.get("choices") or []:
                delta = (choice.get("delta") or {}).get("content") or ""
                if delta and turn.ttft is None:
                    turn.ttft = time.perf_counter() - turn.start
                turn.text += delta
            if event.get("usage"):
                _read_chat_usage(turn, event["usage"])
    agent.messages.append({"role": "assistant", "content": turn.text})


def _read_chat_usage(turn: Turn, usage: dict[str, Any]) -> None:
    turn.prompt_tokens = usage.get("prompt_tokens") or 0
    turn.output_tokens = usage.get("completion_tokens") or 0
    details = usage.get("prompt_tokens_details") or {}
    if details.get("cached_tokens") is not None:
        turn.cached_tokens = details["cached_tokens"]


async def responses_turn(session: aiohttp.ClientSession, url: str, model: str, agent: Agent, turn: Turn,
                         max_tokens: int, new_items: list[dict[str, str]]) -> None:
    body: dict[str, Any] = {"model": model, "input": new_items, "max_output_tokens": max_tokens,
                            "temperature": 0, "stream": True, "store": True}
    if agent.previous_id:
        body["previous_response_id"] = agent.previous_id
    async with session.post(f"{url}/v1/responses", json=body) as resp:
        if resp.status != 200:
            turn.error = f"{resp.status}: {(await resp.text())[:200]}"
            return
        async for event in sse_events(resp):
            kind = event.get("type")
            if kind == "response.output_text.delta":
                if turn.ttft is None:
                    turn.ttft = time.perf_counter() - turn.start
                turn.text += event.get("delta", "")
            elif kind in ("response.completed", "response.incomplete"):  # incomplete: max_output_tokens
                response = event["response"]
                agent.previous_id = response["id"]
                usage = response.get("usage") or {}
                turn.prompt_tokens = usage.get("input_tokens") or 0
                turn.output_tokens = usage.get("output_tokens") or 0
                turn.cached_tokens = (usage.get("input_tokens_details") or {}).get("cached_tokens")


async def run_turn(session: aiohttp.ClientSession, args: argparse.Namespace, model: str, agent: Agent,
                   system: str, t: int) -> Turn:
    items = new_items(args, system, agent.index, t)
    agent.messages.extend(items)
    turn = Turn(agent.index, t, start=time.perf_counter())
    try:
        if args.mode == "chat":
            await chat_turn(session, args.base_url, model, agent, turn, args.max_tokens)
        else:
            await responses_turn(session, args.base_url, model, agent, turn, args.max_tokens, items)
    except (TimeoutError, aiohttp.ClientError, ValueError) as exc:
        turn.error = f"{type(exc).__name__}: {exc}"
    turn.end = time.perf_counter()
    if turn.error is None:
        agent.done = t + 1
    return turn


class Plan:
    """Which turn starts next (see Schedules above): a heap of ready turns keyed by (round, the
    session's place in that round's order); a session's next turn joins it when its turn answers."""

    def __init__(self, order: list[list[int]], active: list[int], start: int, end: int) -> None:
        self.rank = [{s: i for i, s in enumerate(o)} for o in order]
        self.end = end
        self.ready = [(start, self.rank[start][s], s) for s in active]
        heapq.heapify(self.ready)
        self.in_flight = 0
        self.finished = [0] * end  # turns of each round answered or failed
        self.stopped = [0] * end  # sessions whose turn of that round failed (they stop)
        self.sessions = len(active)
        self.wake = asyncio.Condition()

    async def next(self) -> tuple[int, int] | None:
        """The (round, session) to start, or None once nothing is ready nor can become ready."""
        async with self.wake:
            await self.wake.wait_for(lambda: bool(self.ready) or self.in_flight == 0)
            if not self.ready:
                return None
            t, _, s = heapq.heappop(self.ready)
            self.in_flight += 1
            return t, s

    async def answered(self, t: int, s: int, ok: bool) -> bool:
        """Record the turn; True when it was the last of its round."""
        async with self.wake:
            self.in_flight -= 1
            self.finished[t] += 1
            if ok and t + 1 < self.end:
                heapq.heappush(self.ready, (t + 1, self.rank[t + 1][s], s))
            self.stopped[t] += not ok
            self.wake.notify_all()
            return self.finished[t] + sum(self.stopped[:t]) == self.sessions


def round_orders(args: argparse.Namespace) -> list[list[int]]:
    """Each round's session order: shuffled by --seed with --sessions, in index order with --agents."""
    order = []
    for t in range(args.turns):
        sessions = list(range(args.num_sessions))
        if args.sessions:
            random.Random(f"order/{args.seed}/{t}").shuffle(sessions)
        order.append(sessions)
    return order


async def server_state(session: aiohttp.ClientSession, url: str) -> dict[str, Any] | None:
    """radixserve's KV tier counters (and evictions) from /get_server_info; None from a peer."""
    try:
        async with session.get(f"{url}/get_server_info", timeout=aiohttp.ClientTimeout(total=60)) as resp:
            states = (await resp.json()).get("internal_states") if resp.status == 200 else None
    except (TimeoutError, aiohttp.ClientError, ValueError):
        return None
    if not states or not isinstance(states[0], dict):
        return None
    return {k: v for k, v in states[0].items() if k.startswith("tier_") or k in STATE_KEYS}


def load_state(args: argparse.Namespace) -> list[Agent]:
    with open(args.state_file) as fh:
        saved = json.load(fh)
    mine = {k: getattr(args, k) for k in ("num_sessions", "seed", "mode", "split_turn")}
    if saved["args"] != mine:
        sys.exit(f"{args.state_file} was saved with {saved['args']}, not {mine}")
    return [Agent(i, a["messages"], a["previous_id"], a["done"]) for i, a in enumerate(saved["agents"])]


def save_state(args: argparse.Namespace, agents: list[Agent]) -> None:
    saved = {"args": {k: getattr(args, k) for k in ("num_sessions", "seed", "mode", "split_turn")},
             "agents": [{"messages": a.messages, "previous_id": a.previous_id, "done": a.done} for a in agents]}
    with open(args.state_file, "w") as fh:
        json.dump(saved, fh)


async def run_phase(session: aiohttp.ClientSession, args: argparse.Namespace, model: str,
                    agents: list[Agent], start: int, end: int,
                    on_round: Callable[[int], Coroutine[Any, Any, None]]) -> list[Turn]:
    """Turns start..end-1 of every session that answered all turns before `start`, at most
    --concurrency at once."""
    system = system_prompt(args.system_words)
    active = [a.index for a in agents if a.done == start]
    plan = Plan(round_orders(args), active, start, end)
    turns: list[Turn] = []
    snapshots: list[asyncio.Task[None]] = []

    async def worker() -> None:
        while (job := await plan.next()) is not None:
            t, s = job
            turn = await run_turn(session, args, model, agents[s], system, t)
            turns.append(turn)
            if await plan.answered(t, s, turn.error is None):
                snapshots.append(asyncio.create_task(on_round(t)))

    await asyncio.gather(*(worker() for _ in range(args.num_concurrency)))
    await asyncio.gather(*snapshots)
    return turns


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


def tpot(turn: Turn) -> float | None:
    """Seconds per output token after the first (the client's view, as vLLM's bench computes it)."""
    if turn.ttft is None or turn.output_tokens < 2:
        return None
    return (turn.end - turn.start - turn.ttft) / (turn.output_tokens - 1)


def overall(turns: list[Turn], duration: float) -> dict[str, Any]:
    """The whole run in the units of `vllm bench serve` (what scripts/peers_table.py tabulates)."""
    done = [x for x in turns if x.error is None]
    ttfts = [x.ttft * 1000 for x in done if x.ttft is not None]
    tpots = [t * 1000 for t in map(tpot, done) if t is not None]
    later = [x for x in done if x.turn > 0 and x.cached_tokens is not None]
    later_prompt = sum(x.prompt_tokens for x in later)
    return {
        "completed": len(done), "failed": len(turns) - len(done),
        "total_input_tokens": sum(x.prompt_tokens for x in done),
        "total_output_tokens": sum(x.output_tokens for x in done),
        "output_throughput": sum(x.output_tokens for x in done) / duration if duration > 0 else 0.0,
        "median_ttft_ms": statistics.median(ttfts) if ttfts else None,
        "p99_ttft_ms": percentile(ttfts, 99) if ttfts else None,
        "median_tpot_ms": statistics.median(tpots) if tpots else None,
        # The share of later turns' prompts the server reported as cached: None if it reports none.
        "later_turns_cached_share": sum(x.cached_tokens or 0 for x in later) / later_prompt if later_prompt else None,
    }


def stats(done: list[Turn]) -> dict[str, Any]:
    """TTFT p50/p99, cached share and output tok/s (over the span from the first request to the
    last answer) of some answered turns."""
    ttfts = [x.ttft for x in done if x.ttft is not None] or [0.0]
    span = max(x.end for x in done) - min(x.start for x in done)
    reported = [x for x in done if x.cached_tokens is not None]
    prompt = sum(x.prompt_tokens for x in reported)
    return {
        "requests": len(done), "prompt_tokens_mean": statistics.mean(x.prompt_tokens for x in done),
        "ttft_p50_s": percentile(ttfts, 50), "ttft_p99_s": percentile(ttfts, 99),
        "cached_share": sum(x.cached_tokens or 0 for x in reported) / prompt if reported and prompt else None,
        "output_tok_s": sum(x.output_tokens for x in done) / span if span > 0 else 0.0, "span_s": span,
    }


def summarize(turns: list[Turn], count: int) -> list[dict[str, Any]]:
    rows = []
    for t in range(count):
        done = [x for x in turns if x.turn == t and x.error is None]
        if done:
            rows.append({"turn": t + 1, **stats(done)})
    return rows


def print_table(rows: list[dict[str, Any]], returning: dict[str, Any] | None, label: str) -> None:
    print(f"\n{label}")
    print(f"{'turn':>4} {'reqs':>4} {'prompt':>7} {'TTFT p50':>9} {'p99':>7} {'vs t1':>6} {'cached':>7} "
          f"{'out tok/s':>9} {'vs t1':>6}")
    first = rows[0] if rows else None
    for name, r in [(str(r["turn"]), r) for r in rows] + ([("ret", returning)] if returning else []):
        cached = f"{r['cached_share']:.0%}" if r["cached_share"] is not None else "-"
        ttft_ratio = r["ttft_p50_s"] / first["ttft_p50_s"] if first and first["ttft_p50_s"] else 0.0
        tok_ratio = r["output_tok_s"] / first["output_tok_s"] if first and first["output_tok_s"] else 0.0
        print(f"{name:>4} {r['requests']:>4} {r['prompt_tokens_mean']:>7.0f} {r['ttft_p50_s']:>8.3f}s "
              f"{r['ttft_p99_s']:>6.3f}s {ttft_ratio:>5.2f}x {cached:>7} {r['output_tok_s']:>9.1f} {tok_ratio:>5.2f}x")


def tier_line(states: dict[str, Any]) -> str:
    """The tier counters over the run (end minus start), for the log."""
    start, end = states.get("start") or {}, states.get("end") or {}
    keys = ("tier_loads_chosen", "tier_recomputes_chosen", "tier_loads", "tier_loaded_tokens", "tier_hit_tokens",
            "evicted_tokens")
    moved = ", ".join(f"{k} +{end[k] - start.get(k, 0)}" for k in keys if k in end)
    return f"server counters over the run: {moved}; restored at start: {start.get('tier_restored_blocks', 0)} blocks"


async def served_model(session: aiohttp.ClientSession, url: str) -> str:
    async with session.get(f"{url}/v1/models") as resp:
        resp.raise_for_status()
        return str((await resp.json())["data"][0]["id"])


def turn_range(args: argparse.Namespace) -> tuple[int, int]:
    return {"first": (0, args.split_turn), "rest": (args.split_turn, args.turns), "all": (0, args.turns)}[args.phase]


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    timeout = aiohttp.ClientTimeout(total=args.request_timeout)
    # A connection per request: llama-server closes kept-alive connections after a response, and a
    # pooled connection reused at that moment fails the next turn (ServerDisconnectedError).
    connector = aiohttp.TCPConnector(force_close=True)
    start, end = turn_range(args)
    agents = load_state(args) if args.phase == "rest" else [Agent(i) for i in range(args.num_sessions)]
    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
        model = args.model or await served_model(session, args.base_url)
        states: dict[str, Any] = {"start": await server_state(session, args.base_url), "rounds": {}}

        async def on_round(t: int) -> None:
            if states["start"] is not None:
                states["rounds"][str(t + 1)] = await server_state(session, args.base_url)

        began = time.perf_counter()
        turns = await run_phase(session, args, model, agents, start, end, on_round)
        duration = time.perf_counter() - began
        states["end"] = await server_state(session, args.base_url) if states["start"] is not None else None
    if args.phase == "first":
        save_state(args, agents)
    return report(args, model, agents, turns, duration, states if states["start"] is not None else None)


def report(args: argparse.Namespace, model: str, agents: list[Agent], turns: list[Turn], duration: float,
           states: dict[str, Any] | None) -> dict[str, Any]:
    start, end = turn_range(args)
    errors = [t.error for t in turns if t.error]
    skipped = sum(a.done < start for a in agents)  # sessions that failed before this phase
    rows = summarize(turns, end)
    back = [x for x in turns if x.turn > 0 and x.error is None]
    returning = stats(back) if back else None
    label = args.label or f"{args.mode} @ {args.base_url}"
    schedule = (f"{args.num_sessions} sessions, {args.num_concurrency} at once" if args.sessions
                else f"{args.num_sessions} agents")
    print_table(rows, returning, f"{label}: {schedule}, turns {start + 1}-{end} of {args.turns}, {duration:.1f} s")
    if states:
        print(tier_line(states))
    if errors or skipped:
        print(f"{len(errors)} failed requests, {skipped} sessions skipped, first: {errors[:1]}", file=sys.stderr)
    return {"label": label, "mode": args.mode, "model": model, "agents": args.num_sessions, "turns": args.turns,
            "sessions": args.num_sessions, "concurrency": args.num_concurrency, "seed": args.seed,
            "schedule": "sessions" if args.sessions else "agents", "phase": args.phase, "turn_range": [start + 1, end],
            "system_words": args.system_words, "task_words": task_words(args),
            "tool_result_words": args.tool_result_words, "max_tokens": args.max_tokens, "duration_s": duration,
            "failed": len(errors) + skipped, "summary": overall(turns, duration),
            "first_error": errors[0] if errors else None, "per_turn": rows, "returning": returning,
            # Every returning turn's [turn, TTFT s, prompt tokens, cached tokens]: to merge phases' percentiles.
            "returning_turns": [[x.turn + 1, x.ttft, x.prompt_tokens, x.cached_tokens] for x in back],
            "server_state": states, "date": time.strftime("%Y-%m-%d")}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--base-url", default="http://127.0.0.1:30000")
    p.add_argument("--mode", choices=("chat", "responses"), default="chat")
    p.add_argument("--model", help="the model name to send (default: the first of /v1/models)")
    who = p.add_mutually_exclusive_group()
    who.add_argument("--agents", type=int, default=8, help="sessions, all at once (default 8)")
    who.add_argument("--sessions", type=int, help="sessions, --concurrency at once, rounds in a shuffled order")
    p.add_argument("--concurrency", type=int, default=4, help="with --sessions: most turns in flight")
    p.add_argument("--seed", type=int, default=0, help="the texts' and the rounds' orders' seed")
    p.add_argument("--turns", type=int, default=4)
    p.add_argument("--system-words", type=int, default=800, help="the shared tool manual (~1k tokens)")
    p.add_argument("--task-words", type=int, default=40)
    p.add_argument("--history-tokens", type=int, default=0, help="a longer task: ~N tokens at the last turn")
    p.add_argument("--tool-result-words", type=int, default=250, help="each turn's tool result")
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--phase", choices=("all", "first", "rest"), default="all")
    p.add_argument("--split-turn", type=int, help="turns of phase first (default: half of --turns)")
    p.add_argument("--state-file", help="with --phase first/rest: the conversations saved between phases")
    p.add_argument("--request-timeout", type=float, default=600.0)
    p.add_argument("--label", help="the row's name in the table and the JSON (default: mode @ url)")
    p.add_argument("--output-file", help="append the run's numbers as one JSON line")
    args = p.parse_args(argv)
    if urlparse(args.base_url).hostname not in LOOPBACK:
        p.error("--base-url must be a loopback address (this benchmark is for a local server)")
    args.num_sessions = args.sessions or args.agents
    args.num_concurrency = args.concurrency if args.sessions else args.agents
    args.split_turn = args.split_turn or max(1, args.turns // 2)
    if args.phase != "all" and not (args.state_file and 0 < args.split_turn < args.turns):
        p.error("--phase first/rest needs --state-file and 0 < --split-turn < --turns")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    record = asyncio.run(main_async(args))
    if args.output_file:
        with open(args.output_file, "a") as fh:
            fh.write(json.dumps(record) + "\n")
    return 1 if record["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
