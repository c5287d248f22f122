"""`clover quantize SRC DST`: a float Clover checkpoint -> a weight-only INT8 / INT4 one."""

import shutil
from pathlib import Path

import torch

from clover.checkpoint.tokenizer_files import TOKENIZER_FILES
from clover.model import CloverMoeForCausalLM

from .api import DEFAULT_GROUP_SIZE, quantize_model


def quantize_checkpoint(src: str | Path, dst: str | Path, bits: int, group_size: int = DEFAULT_GROUP_SIZE,
                        dtype: str | torch.dtype = "auto", max_shard_size: int | str = "5GB") -> Path:
    """Load `src` (on the CPU, in its own dtype unless `dtype` says otherwise), quantize it and write
    `dst` (replaced atomically) with the tokenizer files of `src`. Peak memory is the float model.
    Raises ValueError (bad bits / group size, an already quantized source) before writing."""
    model = CloverMoeForCausalLM.from_pretrained(src, dtype=dtype)
    if getattr(model.config, "quantization_config", None):
        raise ValueError(f"{src} is already quantized ({model.config.quantization_config})")
    quantize_model(model, bits, group_size, pack=False)  # written as stored: no kernel layout
    model.save_pretrained(dst, max_shard_size=max_shard_size)
    for name in TOKENIZER_FILES:
        if (Path(src) / name).is_file():
            shutil.copy2(Path(src) / name, Path(dst) / name)
    return Path(dst)
