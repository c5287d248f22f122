"""Load a Clover checkpoint for inference: the one path behind `--device`, `--dtype` and
`--quantize` of `clover generate`, `clover eval` and `clover serve` (and the benchmarks).

Weights go straight to the target device (no load on CPU, then move). dtype "auto" means bf16 on
CUDA and fp32 on CPU. `--quantize` is a step after loading, done in place by
`clover.quantization.quantize_model` (a checkpoint written by `clover quantize` loads quantized
without it). `--checkpoint` replaces the weights by a trainer checkpoint's (`OUT/checkpoints/step-N`
of `clover train`) before that, to judge a run while it trains.
"""

import logging
from dataclasses import dataclass
from pathlib import Path

from .dtypes import DTYPE_NAMES, torch_dtype

log = logging.getLogger("clover.loading")

QUANTIZE_SCHEMES = ("int8", "int4")  # the keys of clover.quantization.QUANTIZE_CHOICES


@dataclass(frozen=True)
class LoadOptions:
    device: str = "auto"  # "auto" (cuda if available), "cpu", "cuda", "cuda:1", ...
    dtype: str = "auto"  # "auto" or a name of clover.dtypes.DTYPE_NAMES
    quantize: str | None = None  # None or one of QUANTIZE_SCHEMES
    checkpoint: str | None = None  # a trainer checkpoint whose weights replace the checkpoint's

    def __post_init__(self):
        if self.dtype != "auto" and self.dtype not in DTYPE_NAMES:
            raise ValueError(f"--dtype {self.dtype!r} is not one of auto, {', '.join(DTYPE_NAMES)}")
        if self.quantize is not None and self.quantize not in QUANTIZE_SCHEMES:
            raise ValueError(f"--quantize {self.quantize!r} is not one of {', '.join(QUANTIZE_SCHEMES)}")


def pick_device(device: str = "auto"):
    import torch

    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        return torch.device(device)
    except RuntimeError as e:
        raise ValueError(f"--device {device!r} is not a torch device ({e})") from None


def pick_dtype(dtype: str, device):
    import torch

    if dtype == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return torch_dtype(dtype)


GROUP_SIZES = (128, 64, 32, 16)  # tried in turn by --quantize: the largest that divides every width


def quantize(model, scheme: str):
    """Quantize the loaded model's weights in place with `clover.quantization` ("int8" / "int4") at
    the largest group size of `GROUP_SIZES` that divides every quantized width (small models have
    widths that 128 does not divide); return it. An already quantized model is refused (ValueError)."""
    from clover.model.quantized import check_quantizable
    from clover.quantization import parse_quantize, quantize_model

    bits = parse_quantize(scheme)
    for group_size in GROUP_SIZES:
        try:
            check_quantizable(model, bits, group_size)
        except ValueError:
            continue
        log.info("quantizing to %s with group size %d", scheme, group_size)
        return quantize_model(model, bits, group_size)
    return quantize_model(model, bits, GROUP_SIZES[0])  # raises, naming the first weight 128 does not divide


def load_model(path: str | Path, options: LoadOptions = LoadOptions()):
    """A Clover checkpoint directory -> the model in eval mode on `options.device`."""
    from clover import CloverMoeForCausalLM

    device = pick_device(options.device)
    dtype = pick_dtype(options.dtype, device)
    log.info("loading %s (%s on %s%s)", path, dtype, device,
             f", {options.quantize}" if options.quantize else "")
    model = CloverMoeForCausalLM.from_pretrained(str(path), dtype=dtype, device_map=str(device))
    if options.checkpoint is not None:
        load_trainer_weights(model, options.checkpoint)
    if options.quantize is not None:
        model = quantize(model, options.quantize)
    return model.eval()


def load_trainer_weights(model, checkpoint: str | Path) -> None:
    """Copy a trainer checkpoint's weights into `model` (cast to its dtype and device); a checkpoint
    of another architecture is refused (ValueError naming the first differing tensors)."""
    import torch

    from clover.training.checkpointing import check_fits, load_model_tensors

    log.info("weights from trainer checkpoint %s", checkpoint)
    tensors = load_model_tensors(checkpoint)
    check_fits(model.state_dict(), tensors, f"--checkpoint {checkpoint}")
    with torch.no_grad():
        model.load_state_dict(tensors, strict=True)


def load_tokenizer(path: str | Path):
    """The checkpoint's tokenizer with its mask id made unreachable from text (SPEC §10; see
    `clover.checkpoint.tokenizer_load`). A local folder is read without any network access."""
    from clover.checkpoint.tokenizer_load import load_tokenizer as load_checked

    return load_checked(path, local_files_only=True) if Path(path).is_dir() else load_checked(path)


def load_model_and_tokenizer(path: str | Path, options: LoadOptions = LoadOptions()):
    """(model, tokenizer) of a checkpoint directory; see `load_model`."""
    return load_model(path, options), load_tokenizer(path)
