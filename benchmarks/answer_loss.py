"""Teacher-forced answer loss of models on one pool of fresh training examples, by task and turn:
the score hard-example mining ranks by (`clover.training.mining`), here to compare models on it.

    python benchmarks/answer_loss.py clover/assets/clover-tiny runs/mine \
        --recipe recipes/mine_a_cpu.json --pool 2000 --seed 900

The pool is drawn as the recipe draws its mined pool (its tasks, options, weights and thinking
share) with `--seed`, a data seed no run used. For each model and group it prints the mean answer
loss (-log p(answer | prompt), nats), its median, and the share of answers the model gives more
than even odds (loss < ln 2). Prints a markdown table.
"""

import argparse
import math
import statistics

import torch

from clover.data.tokenizer import load_tokenizer
from clover.loading import LoadOptions, load_model
from clover.training.data import BatchSpec
from clover.training.mining import answer_losses, draw_pool
from clover.training.recipe import load_recipe
from clover.training.sources import build_tasks, tokenizer_roles


def group_stats(losses: list[float], groups: list[str]) -> dict[str, tuple[float, float, float]]:
    """group -> (mean answer loss, median, share of answers with loss < ln 2), groups sorted."""
    out = {}
    for name in sorted(set(groups)):
        mine = [loss for loss, g in zip(losses, groups) if g == name]
        out[name] = (statistics.fmean(mine), statistics.median(mine),
                     sum(loss < math.log(2) for loss in mine) / len(mine))
    return out


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="+", help="checkpoint directories")
    parser.add_argument("--recipe", required=True, help="the recipe whose data mix the pool follows")
    parser.add_argument("--pool", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=900, help="data seed of the pool")
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    data = load_recipe(args.recipe).data
    tasks = build_tasks(data.tasks, data.task_options)
    groups, pairs = draw_pool(data, load_tokenizer(args.models[0]), tasks, args.pool, args.seed)
    columns = []
    for path in args.models:
        model = load_model(path, LoadOptions(device="cpu", dtype="fp32"))
        roles = tokenizer_roles(load_tokenizer(path), mask_id=model.config.mask_token_id)
        spec = BatchSpec(model.config.block_size, roles.eos_id, roles.pad_id, roles.eos_ids)
        columns.append(group_stats(answer_losses(model, pairs, spec), groups))
    print("| group | n | " + " | ".join(f"{m}: mean / median / p>0.5" for m in args.models) + " |")
    print("|---|---:|" + "---|" * len(args.models))
    for name in columns[0]:
        cells = [" / ".join(f"{v:.3f}" for v in column[name]) for column in columns]
        print(f"| {name} | {groups.count(name)} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
