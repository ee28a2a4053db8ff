"""The real scheduler process with a fault injected into its model forward.

`run_faulty_scheduler` is `scheduler.process.run_scheduler_process` (real model, real loop, real
crash report) except that `ModelRunner.forward` raises for a batch holding a request whose
prompt starts with FAULT_PROMPT (the path a kernel error or a bad tensor shape would take), and
never returns for one whose prompt starts with HANG_PROMPT (a hung kernel: the watchdog's case).
"""

from __future__ import annotations

import time
from multiprocessing.connection import Connection

from runtime.contracts.config import ServerConfig

FAULT_PROMPT = [7, 7, 7, 7]
FAULT_MESSAGE = "injected fault in the model forward"
HANG_PROMPT = [8, 8, 8, 8]


def run_faulty_scheduler(config: ServerConfig, ipc_path: str, ready_conn: Connection) -> None:
    from runtime.execution.model_runner import ForwardEntry, ForwardResult, ModelRunner
    from scheduler.process import run_scheduler_process

    real_forward = ModelRunner.forward

    def forward(self: ModelRunner, entries: list[ForwardEntry], keep_logits: bool = False) -> ForwardResult:
        if any(e.prefix_len == 0 and e.input_ids[: len(FAULT_PROMPT)] == FAULT_PROMPT for e in entries):
            raise RuntimeError(FAULT_MESSAGE)
        if any(e.prefix_len == 0 and e.input_ids[: len(HANG_PROMPT)] == HANG_PROMPT for e in entries):
            time.sleep(3600)
        return real_forward(self, entries, keep_logits)

    ModelRunner.forward = forward  # type: ignore[method-assign]
    run_scheduler_process(config, ipc_path, ready_conn)
