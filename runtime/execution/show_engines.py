"""Print the engines the server chooses on this CPU for its flags, with what every alternative
measured (runtime/execution/engines.py; scripts/bench_peers.sh prints this first):

    python -m runtime.execution.show_engines [server flags]

It loads the model as serving does, then measures even where serving would not (serving measures
only with --enable-batch-variance, where the measurement decides something).
"""

from __future__ import annotations

import argparse

from runtime.contracts.config import add_cli_arguments, config_from_args
from runtime.execution.engines import choose_engines, cpu_line
from runtime.execution.model_setup import load_model_for_serving
from runtime.execution.resolve import resolve_config


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="the engines the server chooses for these flags, and why")
    add_cli_arguments(parser)
    config = resolve_config(config_from_args(parser.parse_args(argv)))
    loaded = load_model_for_serving(config)  # measured only with --enable-batch-variance
    choices = loaded.engines if config.enable_batch_variance else choose_engines(
        loaded.model, loaded.backend, config, measure=True)
    print(f"engines on {cpu_line()}: " + "; ".join(choice.line() for choice in choices), flush=True)


if __name__ == "__main__":
    main()
