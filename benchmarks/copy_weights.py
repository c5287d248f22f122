"""How much attention a model's copies put on their sources, by task: the measure copy supervision
trains (`clover.training.copy_attention`).

For fresh training examples of each task (the recipe's options, thinking on), every response token
with a prompt source (`copy_sources`) is read at the causal query that predicts it: the weight on
its source at the best head of any full-attention layer (mean, median, share under 0.5), and each
layer's heads' mean weight.

    python benchmarks/copy_weights.py clover/assets/clover-tiny runs/copy-a/checkpoints/step-0001000 \
        --recipe recipes/copy_a_cpu.json --examples 32 --seed 900

With `--facts`, only joint's fact-line copies (the tokens `train.fact_copy` points at their pilot's
line), to choose the head it trains:

    python benchmarks/copy_weights.py checkpoints/first-h-1000 --recipe recipes/first_j_cpu.json --facts

A trainer checkpoint (`OUT/checkpoints/step-N`) is read in the embedded model's architecture.
"""

import argparse
import sys
from pathlib import Path

import torch

from clover.training.copy_attention import (RecordedAttention, copy_sources, fact_line_sources, joint_fact_tokens,
                                           source_log_weights)
from clover.training.data import collate
from clover.training.loss import causal_logits
from clover.training.recipe import load_recipe
from clover.training.sources import build_tasks, task_train_examples, tokenizer_roles

sys.path.insert(0, str(Path(__file__).parent))
from common import model_or_trainer_checkpoint  # noqa: E402


def source_weights(model, batch, sources: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """(best head's weight on the source [M], each layer's [M, H]) over the M tokens with a source in
    `sources` ([N, R], -1 for none)."""
    with torch.no_grad(), RecordedAttention(model) as recorded:
        causal_logits(model, batch)
    p = batch.prompt_ids.shape[1]
    layers = [source_log_weights(calls, sources, p).exp().transpose(1, 2)[sources >= 0] for calls in recorded]
    return torch.cat(layers, dim=1).max(dim=1).values, layers


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="+", help="checkpoint directories or trainer checkpoints")
    parser.add_argument("--recipe", required=True, help="the recipe whose tasks and options to draw")
    parser.add_argument("--examples", type=int, default=32, help="examples per task")
    parser.add_argument("--seed", type=int, default=900, help="data seed (one no run used)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--facts", action="store_true",
                        help="joint's fact-line copies only (`fact_line_sources`, what `train.fact_copy` trains)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    data = load_recipe(args.recipe).data
    print("| model | task | sourced tokens | best head on source: mean / median / share < 0.5 | heads' mean, per layer |")
    print("|---|---|---:|---|---|")
    for path in args.models:
        model, tokenizer = model_or_trainer_checkpoint(path)
        model.eval()
        roles = tokenizer_roles(tokenizer, mask_id=model.config.mask_token_id)
        facts = joint_fact_tokens(tokenizer) if args.facts else None
        for task in build_tasks(data.tasks, data.task_options):
            if facts and task.name != "joint":
                continue
            _, _, pairs = task_train_examples(tokenizer, [task], args.examples, args.seed, True, 1.0)
            batch = collate(pairs, model.config.block_size, roles.eos_id, roles.pad_id, roles.eos_ids)
            sources = fact_line_sources(batch, facts) if facts else copy_sources(batch)
            best, layers = source_weights(model, batch, sources)
            heads = " / ".join(" ".join(f"{w:.2f}" for w in layer.mean(0)) for layer in layers)
            print(f"| {path} | {task.name} | {best.numel()} | {best.mean():.3f} / {best.median():.3f} / "
                  f"{(best < 0.5).float().mean():.2f} | {heads} |")


if __name__ == "__main__":
    main()
