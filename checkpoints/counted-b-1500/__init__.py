"""The Clover model. Files here import only each other (relative imports), `torch` and
`transformers`, so that a saved checkpoint can carry them for `trust_remote_code=True`."""

from .cache import CloverCache
from .checkpoint_load import CheckpointError
from .configuration_clover_moe import CloverMoeConfig
from .modeling_clover_moe import CloverMoeForCausalLM, CloverMoeModel, CloverOutput

__all__ = ["CheckpointError", "CloverCache", "CloverMoeConfig", "CloverMoeForCausalLM", "CloverMoeModel",
           "CloverOutput"]
