"""The main process's cost of one streamed update, by how long the output already is.

Each update goes the way a streamed chat's does: the detokenizer's delta folded into the request
state (`apply_output`), taken (`take_delta`), read by the choice's reasoning and tool-call readers
(`ChoiceReader`) and encoded as chat.completion.chunk payloads (`ChatAnswer.update`) and their
JSON. For outputs of each length it times the updates of the last 1000 tokens, plain and with
--reasoning-parser qwen3 and tools, and prints microseconds per update and the ratio to the
shortest length (1.0: the cost does not grow with the output). Appends JSON lines to --output.

    .venv/bin/python scripts/bench_stream_updates.py --lengths 1000 10000 100000
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import time
from typing import Any

import orjson

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from runtime.contracts.messages import BatchStrOut, GenerateReq  # noqa: E402
from runtime.contracts.sampling import SamplingParams  # noqa: E402
from tokenizer.core.choices import ChoiceReader  # noqa: E402
from tokenizer.core.events import Tokens, Update, Usage  # noqa: E402
from tokenizer.core.reasoning import PARSERS  # noqa: E402
from tokenizer.core.request import ChatInput, GenRequest, PromptRequest, ReadOptions  # noqa: E402
from tokenizer.core.tools import ToolChoice, ToolPlan  # noqa: E402
from tokenizer.openai.chat import ChatAnswer, ChatRequest  # noqa: E402
from tokenizer.openai.common import Header  # noqa: E402
from tokenizer.request_state import Group, ReqState, apply_output, take_delta  # noqa: E402

TIMED = 1000  # updates timed at the end of each output
READS = {"plain": ReadOptions(),
         "reasoning+tools": ReadOptions(PARSERS["qwen3"], True,
                                        ToolPlan([{"name": "f", "parameters": {"type": "object"}}],
                                                 ToolChoice("auto")), "hermes")}


def _out(token: int) -> BatchStrOut:
    return BatchStrOut(["q"], [None], [" lorem"], [[token]], [3], [token + 1], [0], [None], [None], [None],
                       [None], [None])


def time_updates(length: int, read: ReadOptions) -> float:
    """Microseconds per update over the last TIMED updates of an output of `length` tokens."""
    req = GenerateReq(rid="q", input_ids=[1, 2, 3], sampling_params=SamplingParams(), stream=True)
    state = ReqState.for_request(req, Group(), False)
    prompt = PromptRequest(ChatInput([{"role": "user", "content": "hi"}]), "r", {})
    chat = ChatRequest(GenRequest([prompt], stream=True, read=read), Header("chatcmpl-r", "m", 0), False, False)
    answer, reader = ChatAnswer(chat), ChoiceReader(0, read)
    start = 0.0
    for k in range(length):
        if k == length - TIMED:
            start = time.perf_counter()
        apply_output(state, _out(k), 0, 0.0, lambda ids: [None] * len(ids))
        delta = take_delta(state)
        events: list[Any] = reader.read(("<think>" if k == 0 else "") + delta.text, False)
        events.append(Tokens(0, delta.ids, None, None, Usage(3, k + 1, 0)))
        for payload in answer.update(Update(0, events)):
            orjson.dumps(payload)
    return (time.perf_counter() - start) / TIMED * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lengths", type=int, nargs="+", default=[1000, 10000, 100000])
    parser.add_argument("--output", default="results/bench_stream_updates.jsonl")
    args = parser.parse_args()
    os.makedirs(os.path.dirname(args.output) or ".", exist_ok=True)
    when = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    with open(args.output, "a") as out:
        for name, read in READS.items():
            base = None
            for length in sorted(args.lengths):
                us = time_updates(length, read)
                base = base or us
                print(f"{name:16s} output {length:7d} tokens: {us:7.1f} us per update ({us / base:.2f}x)")
                out.write(json.dumps({"bench": "stream_updates", "time": when, "read": name, "length": length,
                                      "us_per_update": us, "ratio": us / base}) + "\n")


if __name__ == "__main__":
    main()
