"""`clover convert SRC DST`: a transformers Qwen3.5-MoE checkpoint -> a Clover checkpoint.

DST must be a new or empty folder, or with --overwrite a Clover checkpoint (replaced when the
conversion is complete); it may not be SRC, lie inside it or contain it. SIGTERM removes the
partial output; temporaries of an earlier killed run are removed."""

import argparse

from clover.dtypes import DTYPE_NAMES

from .common import sigterm_raises


def register(subparsers) -> None:
    p = subparsers.add_parser("convert", help="convert a transformers Qwen3.5-MoE checkpoint to Clover",
                              description=__doc__)
    p.add_argument("src", help="source checkpoint dir (Qwen3_5MoeForCausalLM or ...ForConditionalGeneration)")
    p.add_argument("dst", help="output dir: new or empty (written when complete)")
    p.add_argument("--overwrite", action="store_true",
                   help="replace DST if it is a Clover checkpoint (a non-empty DST is refused otherwise)")
    p.add_argument("--mask-token-id", type=int, default=None,
                   help="reuse this id for <|mask|> (default: the tokenizer's next free id if the "
                        "embedding has that row, else a new row appended to the vocabulary)")
    p.add_argument("--block-size", type=int, default=32, help="default block length (divides 32)")
    p.add_argument("--dtype", default="auto", choices=["auto", *DTYPE_NAMES], help="output dtype")
    p.add_argument("--coreset", action=argparse.BooleanOptionalAction, default=True,
                   help="enable the MoE block coreset while denoising")
    p.add_argument("--coreset-top-p", type=float, default=0.9, help="routing mass the coreset covers")
    p.add_argument("--max-shard-size", default="5GB", help="largest weight file, e.g. 5GB or 500MB")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from clover.checkpoint import ConvertOptions, convert_checkpoint

    options = ConvertOptions(mask_token_id=args.mask_token_id, block_size=args.block_size, dtype=args.dtype,
                             coreset=args.coreset, coreset_top_p=args.coreset_top_p,
                             max_shard_size=args.max_shard_size)
    with sigterm_raises():
        result = convert_checkpoint(args.src, args.dst, options, overwrite=args.overwrite, progress=True)
    c = result.config
    dtype = str(result.dtype).removeprefix("torch.")
    print(f"wrote {result.path}: vocab {c.vocab_size}, <|mask|> = {c.mask_token_id} ({result.mask_row}), "
          f"block_size {c.block_size}, dtype {dtype}, tokenizer files {result.tokenizer_files or 'none'}")
    return 0
