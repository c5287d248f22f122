"""AdamW with decoupled weight decay on matrices only, a linear warm-up + cosine schedule, and
per-element update multipliers (a per-element learning rate)."""

import math
from collections.abc import Iterator, Mapping
from contextlib import contextmanager

import torch
from torch.optim.lr_scheduler import LambdaLR


def build_optimizer(model: torch.nn.Module, lr: float, weight_decay: float,
                    betas: tuple[float, float]) -> torch.optim.AdamW:
    """Matrices (ndim >= 2: projections, embeddings, stacked experts) decay; norms, biases and the
    block-mode scalars do not."""
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [{"params": [p for p in params if p.ndim >= 2], "weight_decay": weight_decay},
              {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=lr, betas=betas)


def warmup_cosine(warmup_steps: int, total_steps: int, min_ratio: float = 0.1):
    """The LR multiplier at a step: linear from 1/(warmup+1) to 1 over `warmup_steps`, then a cosine
    from 1 down to `min_ratio` at `total_steps` (held there after)."""
    def factor(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / (warmup_steps + 1)
        span = max(1, total_steps - warmup_steps)
        progress = min(1.0, (step - warmup_steps) / span)
        return min_ratio + (1.0 - min_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))
    return factor


def build_scheduler(optimizer: torch.optim.Optimizer, warmup_steps: int, total_steps: int,
                    min_ratio: float = 0.1) -> LambdaLR:
    return LambdaLR(optimizer, warmup_cosine(warmup_steps, total_steps, min_ratio))


@contextmanager
def scaled_updates(scales: Mapping[torch.nn.Parameter, torch.Tensor]) -> Iterator[None]:
    """An optimizer step taken inside moves each listed parameter by its per-element `scale` times
    the step it took. For AdamW that is a per-element learning rate, decoupled weight decay
    included: its moments do not depend on the rate, and its whole step is proportional to it."""
    before = [(param, param.detach().clone(), scale) for param, scale in scales.items()]
    yield
    with torch.no_grad():
        for param, old, scale in before:
            param.copy_(torch.lerp(old, param, scale))  # old + scale * (new - old)
