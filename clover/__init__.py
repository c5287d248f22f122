"""clover: inference, serving and post-training for Clover-style block-diffusion MoE models.

Importing the package is light (no torch, no transformers). `clover_moe` is registered with
transformers' Auto classes on first use: when `AutoConfig`/`AutoModelForCausalLM` load something, or
when one of the model classes below is taken from this package (see `registration`).
"""

from pathlib import Path

from .registration import install as _install_registration
from .registration import register_auto_classes

_install_registration()

EMBEDDED_MODEL = "clover-tiny"
MODEL_CLASSES = ("CloverCache", "CloverMoeConfig", "CloverMoeForCausalLM")


def default_model_dir() -> Path:
    """Directory of the small Clover model trained by this project and shipped in the package."""
    path = Path(__file__).parent / "assets" / EMBEDDED_MODEL
    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"the embedded model is missing at {path}; reinstall the package or "
                                "pass --model DIR")
    return path


def __getattr__(name: str):
    if name in MODEL_CLASSES:
        register_auto_classes()
        from . import model

        return getattr(model, name)
    raise AttributeError(f"module 'clover' has no attribute {name!r}")


__all__ = ["default_model_dir", "register_auto_classes", *MODEL_CLASSES]
