"""The one map from dtype names (as flags and recipes spell them) to torch dtypes.

Names are plain strings so that argument parsers can list them without importing torch."""

DTYPE_NAMES = {"float32": "float32", "fp32": "float32", "bfloat16": "bfloat16", "bf16": "bfloat16",
               "float16": "float16", "fp16": "float16"}


def torch_dtype(name: str):
    """`"bf16"` -> `torch.bfloat16`; an unknown name raises ValueError listing the known ones."""
    import torch

    if name not in DTYPE_NAMES:
        raise ValueError(f"dtype {name!r} is not one of {', '.join(DTYPE_NAMES)}")
    return getattr(torch, DTYPE_NAMES[name])
