"""Task evaluation: accuracy and speed of block diffusion against AR decoding of the same model."""

from clover.evaluation.run import DecodeSummary, EvalReport, evaluate

__all__ = ["DecodeSummary", "EvalReport", "evaluate"]
