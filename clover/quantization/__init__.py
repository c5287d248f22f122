"""Weight-only INT8 / INT4 quantization of Clover models (the format lives in `clover.model.quantized`,
so quantized checkpoints load with `trust_remote_code=True`).

Two phases, as in gpt-fast: `quantize_model` swaps a loaded float model's target weights for
quantized modules in memory; `quantize_checkpoint` writes such a model as a checkpoint whose
config.json carries `quantization_config`, which `from_pretrained` reads back into the same modules.
"""

from .api import DEFAULT_GROUP_SIZE, QUANTIZE_CHOICES, parse_quantize, quantize_model, quantized_bytes
from .checkpoint import quantize_checkpoint
from .error import LayerError, layer_errors

__all__ = ["DEFAULT_GROUP_SIZE", "QUANTIZE_CHOICES", "LayerError", "layer_errors", "parse_quantize",
           "quantize_checkpoint", "quantize_model", "quantized_bytes"]
