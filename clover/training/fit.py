"""`fit_steps`: how many optimizer steps fill a wall-clock budget on this machine.

`clover train RECIPE --fit-minutes M` measures the step time of the recipe's own model, batch
and objective on a throwaway copy of the model (the run itself starts untouched), at steps
spread over the first epoch so that short and long batches both count, then sets
`train.steps` to fill M minutes of training. The resolved recipe (`recipe.json` in the run dir)
records the steps, so the run can be repeated exactly elsewhere. Evaluation and checkpoints come
on top of the M minutes.

`fit.json` in the run dir records the fit, so that `--resume` with the same recipe continues the
schedule the checkpoint was trained on instead of the recipe's unfitted `train.steps`.
"""

import copy
import dataclasses
import json
import time
from pathlib import Path

import torch

from .copy_attention import FactTokens, KeyTokens
from .data import PairDataset
from .line_owner import OwnerTerms
from .distributed import DistInfo, all_reduce_sum
from .trainer import TrainConfig, Trainer


def measure_step_seconds(model: torch.nn.Module, config: TrainConfig, dataset: PairDataset,
                         dist: DistInfo = DistInfo(), steps: int = 8, warmup: int = 2,
                         key_tokens: KeyTokens | None = None,
                         owner_tokens: OwnerTerms | None = None,
                         fact_tokens: FactTokens | None = None) -> float:
    """Mean seconds of one training step (forward, backward, optimizer) over `steps` timed steps
    after `warmup` untimed ones, on a deep copy of `model` (mean over ranks); `key_tokens`,
    `owner_tokens` and `fact_tokens` as the trainer takes them."""
    probe = copy.deepcopy(model)
    trainer = Trainer(probe, config, dataset, None, None, dist, progress=False, key_tokens=key_tokens,
                      owner_tokens=owner_tokens, fact_tokens=fact_tokens)
    span = dataset.batches_per_epoch or config.steps
    positions = [(i * span) // (warmup + steps) for i in range(warmup + steps)]
    seconds = 0.0
    for i, position in enumerate(positions):
        trainer.step = position
        start = time.perf_counter()
        trainer.train_step()  # ends in .item(): the device has finished the step
        if i >= warmup:
            seconds += time.perf_counter() - start
    del trainer, probe
    total, = all_reduce_sum([seconds / steps], dist)
    return total / dist.world_size


def fit_steps(config: TrainConfig, step_seconds: float, minutes: float) -> TrainConfig:
    """`config` with `steps` filling `minutes` at `step_seconds` each (never fewer than its
    warm-up plus one)."""
    if minutes <= 0:
        raise ValueError(f"--fit-minutes={minutes} must be positive")
    steps = max(config.warmup_steps + 1, int(60.0 * minutes / step_seconds))
    return dataclasses.replace(config, steps=steps)


FIT_FILE = "fit.json"


def save_fit(run_dir: Path, minutes: float, step_seconds: float, recipe_steps: int, steps: int) -> None:
    """Record a fit in the run dir: the recipe's `recipe_steps` became `steps`."""
    record = {"minutes": minutes, "step_seconds": step_seconds, "recipe_steps": recipe_steps, "steps": steps}
    (Path(run_dir) / FIT_FILE).write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")


def forget_fit(run_dir: Path) -> None:
    """A fresh run without `--fit-minutes` in `run_dir`: an earlier run's fit no longer applies."""
    (Path(run_dir) / FIT_FILE).unlink(missing_ok=True)


def fitted_config(config: TrainConfig, run_dir: Path) -> TrainConfig:
    """On resume: `config` with the steps an earlier `--fit-minutes` chose in `run_dir`, when the
    recipe still has the steps that fit replaced (an edited `train.steps` is kept as written)."""
    path = Path(run_dir) / FIT_FILE
    if not path.exists():
        return config
    record = json.loads(path.read_text(encoding="utf-8"))
    if config.steps != record["recipe_steps"]:
        return config
    return dataclasses.replace(config, steps=record["steps"])
