"""`generate()` for block-diffusion decoding (SPEC §4). (being written)"""


class BlockDiffusionGenerationMixin:
    """Adds `generate` to `CloverMoeForCausalLM`."""
