"""Checkpoint conversion: transformers Qwen3.5-MoE -> Clover (loading and saving live in `clover.model`)."""

from .convert import ConvertOptions, ConvertResult, convert_checkpoint

__all__ = ["ConvertOptions", "ConvertResult", "convert_checkpoint"]
