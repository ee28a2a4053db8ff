"""Multi-turn agent benchmark: the workload radixserve exists for.

    .venv/bin/python scripts/bench_agents.py --base-url http://127.0.0.1:30000 --mode chat \\
        --agents 8 --turns 4 --output-file results/bench_agents.jsonl

N agents run at once. Every agent's conversation starts with the same system prompt (a "tool
manual" of about `--system-words` words, shared by all agents, so a prefix cache can serve it
to everyone) and a task of its own; each turn streams one answer of `--max-tokens` tokens
(greedy, `ignore_eos` where the server takes it), then appends a "tool result" of about
`--tool-result-words` words, as an agent does after calling a tool.

Modes:
  - `chat`: POST /v1/chat/completions, resending the whole history each turn (what every
    OpenAI-compatible server takes: vLLM, llama.cpp, SGLang, radixserve).
  - `responses`: POST /v1/responses with `previous_response_id`, sending only the new items
    each turn (the server keeps the conversation).

Per turn it reports TTFT p50/p99 (to the first streamed text), the share of prompt tokens the
server reports as cached (`usage.prompt_tokens_details.cached_tokens`, or the Responses API's
`input_tokens_details.cached_tokens`; a server that reports none shows "-"), and output tokens
per second (the turn's output tokens over the span from its first request to its last answer).
Ratios are against the first turn of the same run, the cold one. The run's numbers are appended
as one JSON line to `--output-file` (scripts/plot_benchmarks.py --agents reads it). Only
loopback servers are accepted. Text is made of words, not tokens: the tokens each server counts
are in its usage numbers.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import time
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlparse

import aiohttp

LOOPBACK = {"127.0.0.1", "localhost", "::1"}
WORDS = ("tool call input output schema field value agent file path line search read write list "
         "result error status retry limit token cache query index table row column page step plan "
         "check test build run deploy log trace metric span event queue worker task job batch").split()


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
    index: int
    messages: list[dict[str, str]] = field(default_factory=list)
    previous_id: str | None = None


def words(rng: random.Random, count: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(count))


def system_prompt(count: int) -> str:
    """The shared tool manual: the same text for every agent (seeded once)."""
    return "You are a coding agent. Tool manual: " + words(random.Random(0), count)


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


async def run_agent(session: aiohttp.ClientSession, args: argparse.Namespace, model: str, index: int,
                    system: str) -> list[Turn]:
    rng = random.Random(1000 + index)
    agent = Agent(index)
    new_items = [{"role": "system", "content": system},
                 {"role": "user", "content": f"Task {index}: " + words(rng, args.task_words)}]
    turns = []
    for t in range(args.turns):
        agent.messages.extend(new_items)
        turn = Turn(index, t, start=time.perf_counter())
        try:
            if args.mode == "chat":
                await chat_turn(session, args.base_url, model, agent, turn, args.max_tokens)
            else:
                await responses_turn(session, args.base_url, model, agent, turn, args.max_tokens, new_items)
        except (TimeoutError, aiohttp.ClientError, ValueError) as exc:
            turn.error = f"{type(exc).__name__}: {exc}"
        turn.end = time.perf_counter()
        turns.append(turn)
        if turn.error:
            break
        new_items = [{"role": "user", "content": "Tool result: " + words(rng, args.tool_result_words)}]
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


def summarize(turns: list[Turn], count: int) -> list[dict[str, Any]]:
    rows = []
    for t in range(count):
        done = [x for x in turns if x.turn == t and x.error is None]
        if not done:
            continue
        ttfts = [x.ttft for x in done if x.ttft is not None] or [0.0]
        span = max(x.end for x in done) - min(x.start for x in done)
        reported = [x for x in done if x.cached_tokens is not None]
        prompt = sum(x.prompt_tokens for x in reported)
        rows.append({
            "turn": t + 1, "requests": len(done), "prompt_tokens_mean": statistics.mean(x.prompt_tokens for x in done),
            "ttft_p50_s": percentile(ttfts, 50), "ttft_p99_s": percentile(ttfts, 99),
            "cached_share": sum(x.cached_tokens or 0 for x in reported) / prompt if reported and prompt else None,
            "output_tok_s": sum(x.output_tokens for x in done) / span if span > 0 else 0.0,
        })
    return rows


def print_table(rows: list[dict[str, Any]], label: str) -> None:
    print(f"\n{label}")
    print(f"{'turn':>4} {'reqs':>4} {'prompt':>7} {'TTFT p50':>9} {'p99':>7} {'vs t1':>6} {'cached':>7} "
          f"{'out tok/s':>9} {'vs t1':>6}")
    first = rows[0] if rows else None
    for r in rows:
        cached = f"{r['cached_share']:.0%}" if r["cached_share"] is not None else "-"
        ttft_ratio = r["ttft_p50_s"] / first["ttft_p50_s"] if first and first["ttft_p50_s"] else 0.0
        tok_ratio = r["output_tok_s"] / first["output_tok_s"] if first and first["output_tok_s"] else 0.0
        print(f"{r['turn']:>4} {r['requests']:>4} {r['prompt_tokens_mean']:>7.0f} {r['ttft_p50_s']:>8.3f}s "
              f"{r['ttft_p99_s']:>6.3f}s {ttft_ratio:>5.2f}x {cached:>7} {r['output_tok_s']:>9.1f} {tok_ratio:>5.2f}x")


async def served_model(session: aiohttp.ClientSession, url: str) -> str:
    async with session.get(f"{url}/v1/models") as resp:
        resp.raise_for_status()
        return str((await resp.json())["data"][0]["id"])


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    timeout = aiohttp.ClientTimeout(total=args.request_timeout)
    # A connection per request: llama-server closes kept-alive connections after a response, and a
    # pooled connection reused at that moment fails the next turn (ServerDisconnectedError).
    connector = aiohttp.TCPConnector(force_close=True)
    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
        model = args.model or await served_model(session, args.base_url)
        system = system_prompt(args.system_words)
        start = time.perf_counter()
        per_agent = await asyncio.gather(*(run_agent(session, args, model, i, system) for i in range(args.agents)))
        duration = time.perf_counter() - start
    turns = [t for agent_turns in per_agent for t in agent_turns]
    errors = [t.error for t in turns if t.error]
    rows = summarize(turns, args.turns)
    label = args.label or f"{args.mode} @ {args.base_url}"
    print_table(rows, f"{label}: {args.agents} agents x {args.turns} turns, {duration:.1f} s")
    if errors:
        print(f"{len(errors)} failed requests, first: {errors[0]}", file=sys.stderr)
    return {"label": label, "mode": args.mode, "model": model, "agents": args.agents, "turns": args.turns,
            "system_words": args.system_words, "tool_result_words": args.tool_result_words,
            "max_tokens": args.max_tokens, "duration_s": duration, "failed": len(errors),
            "summary": overall(turns, duration),
            "first_error": errors[0] if errors else None, "per_turn": rows, "date": time.strftime("%Y-%m-%d")}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--base-url", default="http://127.0.0.1:30000")
    p.add_argument("--mode", choices=("chat", "responses"), default="chat")
    p.add_argument("--model", help="the model name to send (default: the first of /v1/models)")
    p.add_argument("--agents", type=int, default=8)
    p.add_argument("--turns", type=int, default=4)
    p.add_argument("--system-words", type=int, default=800, help="the shared tool manual (~1k tokens)")
    p.add_argument("--task-words", type=int, default=40)
    p.add_argument("--tool-result-words", type=int, default=250, help="each turn's tool result")
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--request-timeout", type=float, default=600.0)
    p.add_argument("--label", help="the row's name in the table and the JSON (default: mode @ url)")
    p.add_argument("--output-file", help="append the run's numbers as one JSON line")
    args = p.parse_args(argv)
    if urlparse(args.base_url).hostname not in LOOPBACK:
        p.error("--base-url must be a loopback address (this benchmark is for a local server)")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    report = asyncio.run(main_async(args))
    if args.output_file:
        with open(args.output_file, "a") as fh:
            fh.write(json.dumps(report) + "\n")
    return 1 if report["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
