"""clover: inference, serving and post-training for Clover-style block-diffusion MoE models.

Importing the package registers `clover_moe` with transformers' Auto classes.
"""

from pathlib import Path

from transformers import AutoConfig, AutoModelForCausalLM

from .model import CloverCache, CloverMoeConfig, CloverMoeForCausalLM

AutoConfig.register("clover_moe", CloverMoeConfig, exist_ok=True)
AutoModelForCausalLM.register(CloverMoeConfig, CloverMoeForCausalLM, exist_ok=True)

EMBEDDED_MODEL = "clover-tiny"


def default_model_dir() -> Path:
    """Directory of the small Clover model trained by this project and shipped in the package."""
    path = Path(__file__).parent / "assets" / EMBEDDED_MODEL
    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"the embedded model is missing at {path}; reinstall the package or "
                                "pass --model DIR")
    return path


__all__ = ["default_model_dir", "CloverCache", "CloverMoeConfig", "CloverMoeForCausalLM"]
