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
    p.add_argument("--fit-minutes", type=float, metavar="M",
                   help="measure the step time here first and set the recipe's train.steps so that "
                        "training fills M minutes (the run dir's recipe.json records the steps)")
    p.add_argument("--device", help="train on this device (overrides recipe device: cpu, cuda)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--plan", action="store_true",
                   help="print the per-rank memory plan (parameters, gradients, optimizer, activations) "
                        "for the recipe's model, batch and lengths, and exit without training")
    p.add_argument("--world-size", type=int, nargs="+", default=[8, 16], metavar="N",
                   help="ranks to plan for (default: 8 16)")
    p.add_argument("--gpu-memory", type=float, nargs="+", default=[80.0, 141.0], metavar="GB",
                   help="GPU sizes to check the plan against (default: 80 141)")
    p.add_argument("--seq-len", type=int, nargs=2, metavar=("PROMPT", "RESPONSE"),
                   help="lengths to plan for (default: the recipe's max_prompt_len/max_response_len, else 1024 1024)")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from clover.cli.common import check_device
    from clover.training.recipe import load_recipe
    from clover.training.run import run_recipe

    check_device(args.device)

    recipe = load_recipe(args.recipe).with_overrides(init=args.init, output_dir=args.output,
                                                     device=args.device)
    if args.plan:
        print(plan_table(recipe, args.world_size, args.gpu_memory, args.seq_len))
        return 0
    result = run_recipe(recipe, resume=args.resume, max_steps=args.max_steps,
                        max_minutes=args.max_minutes, progress=not args.no_progress,
                        fit_minutes=args.fit_minutes)
    if result.export_dir is not None:
        s = result.summary
        loss = f"{s.last.loss:.4f}" if s.last else "n/a"
        print(f"step {s.step} ({s.reason}); last loss {loss}; {s.tokens_per_second:.0f} tokens/s; "
              f"checkpoint {s.checkpoint}; model {result.export_dir}")
    return 0


def plan_table(recipe, world_sizes: list[int], gpu_gib: list[float], seq_len) -> str:
    from clover.training.plan import format_plan, memory_plan
    from clover.training.run import plan_config

    cfg, data = recipe.train, recipe.data
    prompt, response = seq_len or (data.max_prompt_len or 1024, data.max_response_len or 1024)
    response += -response % cfg.block_size
    config = plan_config(recipe)
    dtype = "bf16" if cfg.dtype == "bf16" else "fp32"
    plans = [memory_plan(config, w, s, cfg.batch_size, prompt, response, cfg.block_size, dtype,
                         cfg.activation_checkpointing)
             for w in world_sizes for s in dict.fromkeys((cfg.strategy, "fsdp", "ddp"))]
    header = (f"{recipe.name}: batch {cfg.batch_size}, prompt {prompt} + response {response} tokens, "
              f"{dtype}, activation checkpointing {'on' if cfg.activation_checkpointing else 'off'}")
    return format_plan(plans, tuple(gpu_gib), header)
