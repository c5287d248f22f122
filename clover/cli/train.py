"""`clover train RECIPE`: post-train (or train from scratch) a Clover model from a recipe file.

Under torchrun (`torchrun --nproc_per_node N -m clover.cli.main train RECIPE`) every rank runs
this command; data is sharded by rank and only rank 0 writes.
"""

import argparse


def register(subparsers) -> None:
    p = subparsers.add_parser("train", help="train a Clover model from a recipe (JSON or YAML)",
                              description=__doc__)
    p.add_argument("recipe", help="recipe file (.json, .yaml)")
    p.add_argument("--init", help="start from this Clover checkpoint (overrides recipe model.init)")
    p.add_argument("--output", help="run directory (overrides recipe output_dir)")
    p.add_argument("--resume", action="store_true",
                   help="continue from the run directory's latest checkpoint")
    p.add_argument("--max-steps", type=int, help="train at most N more steps in this invocation")
    p.add_argument("--max-minutes", type=float, help="stop (and checkpoint) after M minutes")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from clover.training.recipe import load_recipe
    from clover.training.run import run_recipe

    recipe = load_recipe(args.recipe).with_overrides(init=args.init, output_dir=args.output)
    result = run_recipe(recipe, resume=args.resume, max_steps=args.max_steps,
                        max_minutes=args.max_minutes, progress=not args.no_progress)
    if result.export_dir is not None:
        s = result.summary
        loss = f"{s.last.loss:.4f}" if s.last else "n/a"
        print(f"step {s.step} ({s.reason}); last loss {loss}; {s.tokens_per_second:.0f} tokens/s; "
              f"checkpoint {s.checkpoint}; model {result.export_dir}")
    return 0
