"""The model-loading flags shared by `generate`, `eval` and `serve` (see `clover.loading`), and their
checks: a `--model` that is no checkpoint folder and a `--device` this machine lacks are refused as
user errors (exit 2) before anything is loaded."""

import argparse
from pathlib import Path

from clover.dtypes import DTYPE_NAMES
from clover.loading import QUANTIZE_SCHEMES, LoadOptions  # light: clover.loading imports torch lazily

from .common import UserError, check_device, model_path


def add_model_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default=None, help="checkpoint directory (default: the embedded model)")
    parser.add_argument("--device", default="auto", help="auto (cuda if available), cpu, cuda, cuda:1, mps")
    parser.add_argument("--dtype", default="auto", choices=["auto", *DTYPE_NAMES],
                        help="auto (bf16 on CUDA, fp32 on CPU)")
    parser.add_argument("--quantize", default=None, choices=QUANTIZE_SCHEMES,
                        help="weight-only quantization of the loaded model (clover.quantization)")
    parser.add_argument("--checkpoint", default=None,
                        help="a trainer checkpoint (OUT/checkpoints/step-N of `clover train`) whose weights "
                             "replace --model's, to judge a run while it trains")


def model_dir(args: argparse.Namespace, hub_ok: bool = True) -> Path | str:
    """--model, else the embedded model. A local folder without config.json is refused; a name that is
    no local folder is refused too, unless `hub_ok` and it looks like a Hub repo id (then it is
    returned as given and the user is told so; see `common.model_path`)."""
    if args.model is None:
        import clover

        return clover.default_model_dir()
    name = model_path(args.model, hub_ok=hub_ok)
    directory = Path(name).expanduser()
    if not directory.is_dir():
        return name  # a Hub repo id
    if not (directory / "config.json").is_file():
        raise UserError(f"--model {args.model}: no Clover checkpoint in {directory.resolve()} "
                        "(config.json missing)")
    return directory


def load_options(args: argparse.Namespace) -> LoadOptions:
    """The checked --device/--dtype/--quantize/--checkpoint (an unknown or absent device, or a
    --checkpoint folder without weights, raises UserError)."""
    check_device(args.device)
    if args.checkpoint is not None and not any(Path(args.checkpoint).glob("*.safetensors")):
        raise UserError(f"--checkpoint {args.checkpoint}: no trainer checkpoint there (no *.safetensors files)")
    return LoadOptions(device=args.device, dtype=args.dtype, quantize=args.quantize, checkpoint=args.checkpoint)
