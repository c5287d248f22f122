"""In-memory quantization of a loaded model, and what it weighs."""

import torch
from torch import nn

from clover.model import CloverMoeConfig, CloverMoeForCausalLM
from clover.model.checkpoint_load import params_on_meta
from clover.model.quantized import check_quantizable, quantize_modules

DEFAULT_GROUP_SIZE = 128
QUANTIZE_CHOICES = {"int8": 8, "int4": 4}  # --quantize values


def parse_quantize(value: str | int | None) -> int | None:
    """"int8" / "int4" / 8 / 4 -> bits; None / "none" -> None (keep float weights)."""
    if value in (None, "none"):
        return None
    if value in QUANTIZE_CHOICES:
        return QUANTIZE_CHOICES[value]
    if value in (8, 4, "8", "4"):
        return int(value)
    raise ValueError(f"quantize={value!r} must be one of {sorted(QUANTIZE_CHOICES)} or none")


@torch.no_grad()
def quantize_model(model: CloverMoeForCausalLM, bits: int = 4, group_size: int = DEFAULT_GROUP_SIZE,
                   pack: bool = True):
    """Quantize `model` in place (experts, shared expert, attention and GDN projections; see
    `clover.model.quantized`) and return it, its weights laid out for torch's CPU kernels unless
    `pack=False`. Its config gains `quantization_config`, so `save_pretrained` writes a quantized
    checkpoint (in the stored format either way). Raises ValueError for bits not in (8, 4), or a
    group size that does not divide a quantized width, before changing anything."""
    check_quantizable(model, bits, group_size)
    return quantize_modules(model, bits, group_size, pack=pack)


def _param_bytes(model: nn.Module, float_bytes: int) -> int:
    return sum(p.numel() * (float_bytes if p.is_floating_point() else p.element_size())
               for p in model.parameters())


def quantized_bytes(config: CloverMoeConfig, bits: int | None, group_size: int = DEFAULT_GROUP_SIZE,
                    float_bytes: int = 2) -> int:
    """Exact weight bytes of `config` in this format (floats at `float_bytes` each, bf16 by default),
    counted on the meta device; `bits=None` counts the float model."""
    with params_on_meta():
        model = CloverMoeForCausalLM(config)
    if bits is not None:
        quantize_modules(model, bits, group_size)
    return _param_bytes(model, float_bytes)
