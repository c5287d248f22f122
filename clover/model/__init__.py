"""The Clover model. Files here import only each other (relative imports), `torch` and
`transformers`, so that a saved checkpoint can carry them for `trust_remote_code=True`."""

from .cache import CloverCache
from .configuration_clover_moe import CloverMoeConfig
from .modeling_clover_moe import CloverMoeForCausalLM, CloverMoeModel, CloverOutput

__all__ = ["CloverCache", "CloverMoeConfig", "CloverMoeForCausalLM", "CloverMoeModel", "CloverOutput"]
