"""`clover` command: each subcommand lives in its own module exposing `register(subparsers)`."""

import argparse
import importlib
import sys

COMMANDS = ["info", "convert", "quantize", "generate", "train", "eval", "serve", "bench"]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="clover", description="Clover block-diffusion MoE toolkit")
    sub = parser.add_subparsers(dest="command", required=True)
    for name in COMMANDS:
        try:
            module = importlib.import_module(f"clover.cli.{name}")
        except ModuleNotFoundError as e:
            if e.name == f"clover.cli.{name}":
                continue  # command not built yet
            raise
        module.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.run(args) or 0
    except (ValueError, FileNotFoundError) as e:
        print(f"clover {args.command}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
