"""The `radixserve` command line.

    radixserve serve [--model-path PATH] [--port 30000] ...   serve a model over HTTP
    radixserve model-path                                     print (and prepare) the default model folder
    radixserve model-path --gguf                              print the default model's shipped Q4_1 file

The `serve` flags are generated from `ServerConfig`'s fields by `runtime.contracts.config.add_cli_arguments`.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from runtime.contracts.config import ServerConfig, add_cli_arguments, config_from_args
from runtime.contracts.errors import InvalidRequest


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="radixserve", description="radixserve: a small LLM serving runtime")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    serve = commands.add_parser("serve", help="serve a model over HTTP (default: the embedded SmolLM2-135M-Instruct)")
    add_cli_arguments(serve)
    where = commands.add_parser("model-path", help="print the default model's folder, converting it first if needed")
    where.add_argument("--gguf", action="store_true", help="print the Q4_1 .gguf file it ships as instead")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "model-path":
        from runtime.support.default_model import ensure_default_model, gguf_path

        print(gguf_path() if args.gguf else ensure_default_model())
        return 0
    try:
        config = config_from_args(args)
    except InvalidRequest as exc:
        parser.error(str(exc))
    return serve(config)


def serve(config: ServerConfig) -> int:
    """Run the HTTP server until it is stopped; its exit code."""
    from tokenizer.http_server import serve as serve_http

    return serve_http(config)


if __name__ == "__main__":
    sys.exit(main())
