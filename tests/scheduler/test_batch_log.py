"""SGLang's per-batch debug lines: a prefill line per prefill batch, a decode line every 40 decode steps."""

from __future__ import annotations

import logging
import re

import pytest

from scheduler.batch_log import DECODE_LOG_INTERVAL
from tests.scheduler.harness import make, run_until_idle, submit

PREFILL = re.compile(r"Prefill batch\. #new-seq: (\d+), #new-token: (\d+), #cached-token: (\d+), token usage: "
                     r"[\d.]+, #running-req: \d+, #queue-req: \d+$")
DECODE = re.compile(r"Decode batch\. #running-req: (\d+), #token: \d+, token usage: [\d.]+, "
                    r"gen throughput \(token/s\): [\d.]+, #queue-req: \d+$")


def test_lines_in_sglangs_words(tiny_model: str, caplog: pytest.LogCaptureFixture) -> None:
    sched, io = make(tiny_model)
    with caplog.at_level(logging.DEBUG, logger="scheduler.scheduler"):
        submit(io, "a", list(range(10, 30)), max_new_tokens=DECODE_LOG_INTERVAL + 5)
        run_until_idle(sched, io)
        submit(io, "b", list(range(10, 30)) + [5], max_new_tokens=2)  # hits a's cached prompt
        run_until_idle(sched, io)
    lines = [r.getMessage() for r in caplog.records if "batch." in r.getMessage()]
    prefills = [PREFILL.match(line) for line in lines if line.startswith("Prefill")]
    assert all(prefills) and [(m[1], m[2]) for m in prefills] == [("1", "20"), ("1", str(21 - int(prefills[1][3])))]
    assert int(prefills[1][3]) >= 19
    decodes = [line for line in lines if line.startswith("Decode")]
    assert len(decodes) == 1 and DECODE.match(decodes[0])
