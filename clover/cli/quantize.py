"""`clover quantize SRC DST --bits {8,4}`: write a weight-only quantized copy of a Clover checkpoint."""

import argparse

DEFAULT_GROUP_SIZE = 128  # clover.quantization.DEFAULT_GROUP_SIZE (that module imports torch)


def register(subparsers) -> None:
    p = subparsers.add_parser("quantize", help="weight-only INT8 / INT4 quantization of a Clover checkpoint",
                              description=__doc__)
    p.add_argument("src", help="float Clover checkpoint dir")
    p.add_argument("dst", help="output dir (replaced when complete)")
    p.add_argument("--bits", type=int, choices=[8, 4], required=True, help="weight bits")
    p.add_argument("--group-size", type=int, default=DEFAULT_GROUP_SIZE,
                   help="input columns per scale (must divide every quantized width)")
    p.add_argument("--dtype", default="auto", help="float dtype of scales and unquantized weights")
    p.add_argument("--max-shard-size", default="5GB", help="largest weight file, e.g. 5GB or 500MB")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from clover.quantization import quantize_checkpoint

    path = quantize_checkpoint(args.src, args.dst, args.bits, args.group_size, args.dtype, args.max_shard_size)
    print(f"wrote {path}: int{args.bits} weights, group size {args.group_size}")
    return 0
