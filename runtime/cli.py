"""The `radixserve` command line.

    radixserve serve [--model-path PATH] [--port 30000] ...   serve a model over HTTP
    radixserve model-path                                     print (and prepare) the default model folder

The `serve` flags are generated from `ServerConfig`'s fields by `runtime.config.add_cli_arguments`.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import sys
from collections.abc import Sequence

from runtime.config import ServerConfig, add_cli_arguments, config_from_args
from runtime.errors import InvalidRequest


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="radixserve", description="radixserve: a small LLM serving runtime")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    serve = commands.add_parser("serve", help="serve a model over HTTP (default: the embedded SmolLM2-135M-Instruct)")
    add_cli_arguments(serve)
    commands.add_parser("model-path", help="print the default model's folder, converting it first if needed")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "model-path":
        from runtime.default_model import ensure_default_model

        print(ensure_default_model())
        return 0
    try:
        config = config_from_args(args)
    except InvalidRequest as exc:
        parser.error(str(exc))
    return serve(config)


def serve(config: ServerConfig) -> int:
    """Run the HTTP server (`tokenizer.http_server`); until it exists, the generation demo."""
    for module_name, entry in (("tokenizer.http_server", "serve"), ("runtime.demo", "main")):
        if importlib.util.find_spec(module_name) is not None:
            result = getattr(importlib.import_module(module_name), entry)(config)
            return result if isinstance(result, int) else 0
    print("radixserve: the server is not built yet (neither tokenizer/http_server.py nor runtime/demo.py exists)",
          file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
