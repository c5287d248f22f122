"""`clover average DST SRC [SRC ...]`: the mean of several checkpoints' weights (a model soup).

Each SRC is a Clover checkpoint folder or a trainer checkpoint (`OUT/checkpoints/step-N`); all must
share one architecture. DST gets the config, tokenizer and generation defaults of --base (default:
the first SRC, which must then be a checkpoint folder) and is written when complete."""

import argparse


def register(subparsers) -> None:
    p = subparsers.add_parser("average", help="average the weights of checkpoints of one architecture",
                              description=__doc__)
    p.add_argument("dst", help="output dir: new, empty, or a Clover checkpoint to replace")
    p.add_argument("src", nargs="+", help="checkpoint folders or trainer checkpoints to average")
    p.add_argument("--base", default=None,
                   help="checkpoint folder whose config and tokenizer DST takes (default: the first SRC)")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from clover.training.average import average_checkpoints

    path = average_checkpoints(args.src, args.dst, args.base)
    print(f"wrote {path}: the mean of {len(args.src)} checkpoints' weights")
    return 0
