"""`clover` command: each subcommand lives in its own module exposing `register(subparsers)`.

Registering a command imports nothing heavy: torch, transformers and the model are imported by the
command's `run`, so `clover --help` and `clover CMD --help` answer at once."""

import argparse
import importlib
import os
import sys
import traceback

from .common import is_user_error

COMMANDS = ["info", "convert", "quantize", "average", "generate", "train", "eval", "serve"]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="clover", description="Clover block-diffusion MoE toolkit")
    sub = parser.add_subparsers(dest="command", required=True)
    for name in COMMANDS:
        importlib.import_module(f"clover.cli.{name}").register(sub)
    return parser


def _one_line(e: BaseException) -> str:
    return " ".join(str(e).split()) or type(e).__name__


def main(argv: list[str] | None = None) -> int:
    """Exit 0 on success; 2 with one line for a user error (bad value, file or folder); 1 with one
    line for an internal error (CLOVER_DEBUG=1 adds the traceback); 130 on Ctrl-C."""
    args = build_parser().parse_args(argv)
    try:
        return args.run(args) or 0
    except KeyboardInterrupt:
        print(f"clover {args.command}: interrupted", file=sys.stderr)
        return 130
    except Exception as e:  # noqa: BLE001 - every failure ends in one line and an exit code
        if is_user_error(e):
            print(f"clover {args.command}: error: {_one_line(e)}", file=sys.stderr)
            return 2
        if os.environ.get("CLOVER_DEBUG"):
            traceback.print_exc()
        print(f"clover {args.command}: internal error: {type(e).__name__}: {_one_line(e)} "
              "(set CLOVER_DEBUG=1 for the traceback)", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
