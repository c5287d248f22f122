"""Run by `torch.distributed.run` in test_distributed: trains a recipe, then each rank saves its
final loss and weights to OUT/rank{r}.pt so the test can compare ranks."""

import os
import sys

import torch

from clover.training.recipe import load_recipe
from clover.training.run import run_recipe

recipe_path, out = sys.argv[1], sys.argv[2]
result = run_recipe(load_recipe(recipe_path), progress=False)
torch.save({"loss": result.summary.last.loss, "step": result.summary.step,
            "params": result.model.state_dict()}, os.path.join(out, f"rank{os.environ['RANK']}.pt"))
