"""`clover eval`: task accuracy, tokens per forward and tokens/s, block diffusion vs AR (and
self-speculative decoding with `--self-spec`)."""

import json

from .common import UserError, add_block_rule_arguments, json_option
from .model_options import add_model_arguments, load_options, model_dir


def register(sub) -> None:
    p = sub.add_parser("eval", help="evaluate a model on held-out task prompts (diffusion vs AR)")
    add_model_arguments(p)
    p.add_argument("--task", default="all", help="task name or 'all'")
    p.add_argument("--limit", type=int, default=40, help="prompts per task (default 40)")
    p.add_argument("--seed", type=int, nargs="+", default=[0], metavar="SEED",
                   help="evaluation split seed; several (`--seed 0 3 4`) pool their prompts into one report")
    p.add_argument("--option", action="append", default=[], metavar="TASK.NAME=JSON",
                   help="a task option for the prompts, the value as JSON (repeatable), e.g. "
                        "airspace.min_notices=4 or 'joint.facts=\"roster\"'")
    p.add_argument("--threshold", type=float, default=None,
                   help="confidence threshold (default: the checkpoint's generation config)")
    p.add_argument("--block-size", type=int, default=None,
                   help="block size (default: the checkpoint's generation config)")
    add_block_rule_arguments(p)
    p.add_argument("--max-new-tokens", type=int, default=512)
    thinking = p.add_mutually_exclusive_group()
    thinking.add_argument("--thinking", dest="thinking", action="store_true", default=None,
                          help="thinking turn (default: the chat template's default)")
    thinking.add_argument("--no-thinking", dest="thinking", action="store_false")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    p.add_argument("--batch-size", type=int, default=1,
                   help="prompts decoded together (default 1: batch-1 latency, what the speed-up is "
                        "quoted at); more is faster for accuracy, and the speed is then the batch's")
    p.add_argument("--no-ar", action="store_true", help="skip the AR baseline")
    p.add_argument("--no-block-diffusion", action="store_true",
                   help="skip block diffusion (AR only, e.g. for a stage trained with the AR loss alone)")
    p.add_argument("--self-spec", action="store_true",
                   help="also decode with lossless self-speculative decoding (its text must equal AR's)")
    p.add_argument("--field-loss", action="store_true",
                   help="also print per-field AR and block-mode loss (nats per token) on the prompts")
    p.add_argument("--json", action="store_true", help="print one JSON object as the last line")
    p.set_defaults(run=run)


def run(args) -> int:
    import torch

    from clover.data import EVAL_TASKS, TASKS, eval_examples, get_task
    from clover.evaluation.run import evaluate, report_lines
    from clover.loading import load_model_and_tokenizer

    if args.limit <= 0:
        raise ValueError(f"--limit={args.limit} must be positive")
    if args.threads is not None:
        if args.threads <= 0:
            raise ValueError(f"--threads={args.threads} must be positive")
        torch.set_num_threads(args.threads)
    if args.no_ar and args.no_block_diffusion and not args.self_spec:
        raise UserError("--no-ar with --no-block-diffusion leaves no mode to decode; add --self-spec or drop one")
    if args.batch_size <= 0:
        raise ValueError(f"--batch-size={args.batch_size} must be positive")
    if len(set(args.seed)) != len(args.seed):
        raise ValueError(f"--seed {' '.join(map(str, args.seed))} repeats a seed; each would count its prompts twice")
    if args.task != "all" and args.task not in TASKS:
        raise ValueError(f"--task={args.task!r} is unknown; known: {sorted(TASKS)} or 'all'")
    names = list(EVAL_TASKS if args.task == "all" else [args.task])
    options = options_by_task(args.option, names)
    try:
        tasks = [get_task(n, **options.get(n, {})) for n in names]
    except TypeError as error:  # an option the task does not take
        raise UserError(f"--option: {error}") from None
    directory = model_dir(args)
    model, tokenizer = load_model_and_tokenizer(directory, load_options(args))
    examples = [e for seed in args.seed for e in eval_examples(args.limit, seed=seed, tasks=tasks)]
    name = f"{directory} with the weights of {args.checkpoint}" if args.checkpoint else str(directory)
    report = evaluate(model, tokenizer, examples, model_name=name, task=args.task,
                      threshold=args.threshold, block_size=args.block_size,
                      max_new_tokens=args.max_new_tokens, with_ar=not args.no_ar,
                      with_diffusion=not args.no_block_diffusion,
                      enable_thinking=args.thinking, with_self_spec=args.self_spec, batch_size=args.batch_size,
                      fallback=args.fallback, fill=args.fill)
    print(f"seeds {' '.join(map(str, args.seed))}: {args.limit} prompts per task each")
    if options:
        print(f"task options: {json.dumps(options)}")
    print("\n".join(report_lines(report)))
    result = report.to_json() | {"seeds": args.seed, "task_options": options}
    if args.field_loss:
        from clover.evaluation.field_loss import field_loss_lines, field_losses

        losses = field_losses(model, tokenizer, examples, args.block_size, args.thinking)
        print("\n".join(field_loss_lines(losses)))
        result["field_loss"] = losses
    if args.json:
        print(json.dumps(result))
    return 0


def options_by_task(pairs: list[str], tasks: list[str]) -> dict[str, dict]:
    """`["joint.balanced=true"]` -> `{"joint": {"balanced": True}}`, for the evaluated `tasks` only."""
    options: dict[str, dict] = {}
    for pair in pairs:
        key, value = json_option(pair, "--option", "joint.balanced=true")
        task, dot, name = key.partition(".")
        if not (dot and name) or task not in tasks:
            raise UserError(f"--option {pair!r}: expected TASK.NAME=JSON with TASK one of the evaluated "
                            f"tasks {tasks}")
        options.setdefault(task, {})[name] = value
    return options
