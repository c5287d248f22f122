"""clover: inference, serving and post-training for Clover-style block-diffusion MoE models.

Importing the package registers `clover_moe` with transformers' Auto classes.
"""

from transformers import AutoConfig, AutoModelForCausalLM

from .model import CloverCache, CloverMoeConfig, CloverMoeForCausalLM

AutoConfig.register("clover_moe", CloverMoeConfig, exist_ok=True)
AutoModelForCausalLM.register(CloverMoeConfig, CloverMoeForCausalLM, exist_ok=True)

__all__ = ["CloverCache", "CloverMoeConfig", "CloverMoeForCausalLM"]
