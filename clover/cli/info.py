"""`clover info`: parameter counts, memory and layout of a checkpoint's config or a preset."""

import argparse
import json

DEFAULT_PRESET = "clover-35b-a3b"


def register(subparsers) -> None:
    parser = subparsers.add_parser("info", help="model facts from a config (no weights are loaded)")
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--model", metavar="DIR", help="checkpoint directory (reads only config.json)")
    source.add_argument("--preset", help=f"a built-in config (default {DEFAULT_PRESET})")
    parser.add_argument("--bits", type=int, choices=(16, 8, 4),
                        help="show only the weights at this width (16 = bf16) and whether they fit 16 / 24 GB")
    parser.add_argument("--group-size", type=int, default=128, help="quantization group size (default 128)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from clover.info import config_from_dir, format_info, model_info, preset_config

    config = config_from_dir(args.model) if args.model else preset_config(args.preset or DEFAULT_PRESET)
    info = model_info(config, args.group_size)
    print(json.dumps(info.to_dict(), indent=2, ensure_ascii=False) if args.json else format_info(info, args.bits))
    return 0
