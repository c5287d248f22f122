"""What the benchmarks share: the mid-size random Clover that `decode.py` and `forward.py` time, and
the rewrite of one section of BENCHMARKS.md. Imported as `common` (a benchmark's own folder is on
`sys.path` when it runs as `python benchmarks/NAME.py`); torch and clover load only when a model is
built, so importing this costs nothing."""

from pathlib import Path

# hidden 1024, 8 layers of 3 GDN + 1 attention, 64 experts top-8, vocab 32k; each benchmark adds
# its `max_position_embeddings`
MID_CONFIG = dict(
    vocab_size=32000, hidden_size=1024, num_hidden_layers=8, num_attention_heads=8,
    num_key_value_heads=2, head_dim=128, linear_num_key_heads=8, linear_num_value_heads=16,
    linear_key_head_dim=64, linear_value_head_dim=64, num_experts=64, num_experts_per_tok=8,
    moe_intermediate_size=512, shared_expert_intermediate_size=512, mask_token_id=31999,
)


def mid_model(config: dict, dtype, device="cpu", head_scale: float | None = None):
    """A random Clover of `config` in eval mode (seed 0). Router weights get std 2/sqrt(hidden):
    peaked routing, as in trained routers; the right-conv weights (zero at init) std 0.02. With
    `head_scale`, the lm_head is scaled up so that output distributions are peaked."""
    import torch

    from clover.model import CloverMoeConfig, CloverMoeForCausalLM

    torch.manual_seed(0)
    model = CloverMoeForCausalLM(CloverMoeConfig(**config)).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("mlp.gate.weight"):
                p.normal_(0.0, 2.0 / config["hidden_size"] ** 0.5)
            elif "conv_right_weight" in name:
                p.normal_(0.0, 0.02)
        if head_scale is not None:
            model.lm_head.weight.mul_(head_scale)
    return model.to(device=device, dtype=dtype)


# a small random Clover for the serving benchmarks when no trained model fits (hidden 256, 4 layers)
RANDOM_CONFIG = dict(hidden_size=256, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                     head_dim=64, linear_num_key_heads=4, linear_num_value_heads=8, linear_key_head_dim=32,
                     linear_value_head_dim=32, num_experts=16, num_experts_per_tok=4, moe_intermediate_size=256,
                     shared_expert_intermediate_size=256, max_position_embeddings=4096)


def random_checkpoint(directory: Path, head_scale: float, **config) -> Path:
    """Save a random Clover of RANDOM_CONFIG (`config` overrides) with a task tokenizer to
    `directory`; its lm_head is scaled by `head_scale`, so its distributions are peaked and a block
    fills in few steps."""
    import torch

    from clover.data import save_tokenizer, train_task_tokenizer
    from clover.model import CloverMoeConfig, CloverMoeForCausalLM

    tok = train_task_tokenizer(vocab_size=1000, n_examples=400)
    torch.manual_seed(0)
    model = CloverMoeForCausalLM(CloverMoeConfig(vocab_size=len(tok), mask_token_id=tok.mask_token_id,
                                                 **(RANDOM_CONFIG | config))).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "conv_right_weight" in name:
                p.normal_(0.0, 0.02)
        model.lm_head.weight.mul_(head_scale)
    model.save_pretrained(directory)
    save_tokenizer(tok, directory)
    return directory


def embedded_engine_inputs(max_new_tokens: int, model_dir=None):
    """(model, tokenizer, request config) of the embedded model (or the checkpoint at `model_dir`)
    in fp32 for the engine benchmarks: greedy defaults of the checkpoint, `max_new_tokens` per
    request, no EOS (every request runs its whole budget)."""
    from clover.serving.admission import request_config
    from clover.serving.runtime import server_defaults

    _, model, tok = embedded_fp32(model_dir)
    cfg = request_config(server_defaults(model, tok), dict(max_new_tokens=max_new_tokens, eos_token_id=[]),
                         model.config.vocab_size)
    return model, tok, cfg


def write_section(path: Path, title: str, lines: list[str]) -> None:
    """Replace (or append) the `## {title}` section of `path`, leaving every other section as it is."""
    text = path.read_text() if path.exists() else "# Benchmarks\n"
    section = "\n".join([f"## {title}", ""] + lines) + "\n"
    start = text.find(f"\n## {title}")
    if start < 0:
        path.write_text(text.rstrip("\n") + "\n\n" + section)
        return
    end = text.find("\n## ", start + 1)
    rest = "" if end < 0 else text[end:]
    path.write_text(text[:start + 1] + section + rest)


def embedded_probe_parser(doc: str, limit: int = 40, limit_help: str = "prompts per task", seed: int = 1):
    """An argument parser with what every probe of the embedded model takes: --model (default: the
    embedded model), --checkpoint, --limit, --seed (the evaluation split) and --threads."""
    import argparse

    parser = argparse.ArgumentParser(description=doc,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None)
    parser.add_argument("--checkpoint", default=None,
                        help="a trainer checkpoint (OUT/checkpoints/step-N) whose weights replace "
                             "--model's, to judge a run while it trains")
    parser.add_argument("--limit", type=int, default=limit, help=limit_help)
    parser.add_argument("--seed", type=int, default=seed, help="evaluation split seed")
    parser.add_argument("--threads", type=int, default=1)
    return parser


def task_options(pairs: list[str]) -> dict:
    """`["balanced=true", "min_notices=4"]` -> `{"balanced": True, "min_notices": 4}` (values as JSON)."""
    from clover.cli.common import UserError, json_option

    try:
        return dict(json_option(pair, "--option", "balanced=true or min_notices=4") for pair in pairs)
    except UserError as error:
        raise SystemExit(str(error)) from None


def joint_probe_inputs(doc: str, limit: int, seed: int, what: str, extra=None):
    """`(model, tokenizer, examples, args)` of a teacher-forced joint probe: the parser of
    `embedded_probe_parser` with --option (a joint task option, repeatable), and whatever
    `extra(parser)` adds, and `--limit` joint prompts of the evaluation split at `--seed`. Prints
    which, then `what` the probe measures."""
    from clover.data import eval_examples, get_task

    parser = embedded_probe_parser(doc, limit=limit, limit_help="joint prompts", seed=seed)
    parser.add_argument("--option", action="append", default=[], metavar="NAME=JSON",
                        help='a joint task option for the prompts (repeatable), e.g. line_rules="keyed_first"')
    if extra:
        extra(parser)
    args = parser.parse_args()
    path, model, tokenizer = load_probe_model(args)
    examples = eval_examples(args.limit, seed=args.seed, tasks=[get_task("joint", **task_options(args.option))])
    options = "".join(f", {o}" for o in args.option)
    print(f"model {path}, {len(examples)} joint prompts (seed {args.seed}{options}), teacher-forced; {what}\n",
          flush=True)
    return model, tokenizer, examples, args


def decode_task_errors(doc: str, task_name: str, teacher_forced_table):
    """The shared half of a task's error probe (`joint_errors.py`, `airspace_errors.py`): parse the
    probe options plus --quiet and --teacher-forced, load the model and draw the task's prompts.
    With --teacher-forced print `teacher_forced_table(model, tokenizer, examples)`'s rows and return
    None; else decode every prompt greedily by block diffusion (the checkpoint's block size and
    threshold) and AR, interleaved, and return `(args, task, examples, {mode: DecodeSummary})`."""
    import torch

    from clover.data import eval_examples, get_task
    from clover.evaluation.run import decode_all

    parser = embedded_probe_parser(doc, limit_help=f"{task_name} prompts")
    parser.add_argument("--quiet", action="store_true", help="only the tables")
    parser.add_argument("--teacher-forced", action="store_true",
                        help="no decoding: per-part accuracy on the target answer (see above)")
    parser.add_argument("--option", action="append", default=[], metavar="NAME=JSON",
                        help=f"a {task_name} task option for the prompts (repeatable), e.g. "
                             "balanced=true or min_notices=4")
    args = parser.parse_args()
    try:
        task = get_task(task_name, **task_options(args.option))
    except (TypeError, ValueError) as error:
        raise SystemExit(f"--option: {error}") from None
    path, model, tokenizer = load_probe_model(args)
    examples = eval_examples(args.limit, seed=args.seed, tasks=[task])
    what = f"{len(examples)} {task_name} prompts (seed {args.seed}{''.join(f', {o}' for o in args.option)})"
    if args.teacher_forced:
        print(f"model {path}, {what}, teacher-forced, thinking on\n")
        with torch.inference_mode():
            print("\n".join(teacher_forced_table(model, tokenizer, examples)))
        return None
    size, threshold = model.generation_config.block_size, model.generation_config.threshold
    modes = {"block_diffusion": {"max_new_tokens": 512, "block_size": size, "threshold": threshold},
             "ar": {"max_new_tokens": 512}}
    print(f"model {path}, {what}, thinking on, greedy\n")
    with torch.inference_mode():
        return args, task, examples, decode_all(model, tokenizer, examples, modes)


def kinds_table(table: dict, n: int, kinds: tuple[str, ...], width: int) -> list[str]:
    """Rows of an error probe's table: per mode, the prompts right and wrong of `n`, and the wrong ones
    by kind (`table`: mode -> Counter of kinds)."""
    rows = [f"{'mode':<16}{'right':>7}{'wrong':>7}" + "".join(f"{k:>{width}}" for k in kinds)]
    for mode, counts in table.items():
        wrong = sum(counts.values())
        rows.append(f"{mode:<16}{n - wrong:>7}{wrong:>7}" + "".join(f"{counts[k]:>{width}}" for k in kinds))
    return rows


def load_probe_model(args):
    """(path, model, tokenizer) for a probe's `args`: fp32 on CPU with `args.threads` threads; with
    `args.checkpoint` the trainer checkpoint's weights in `args.model`'s architecture."""
    import torch

    torch.set_num_threads(args.threads)
    path, model, tokenizer = embedded_fp32(args.model)
    if args.checkpoint:
        from clover.loading import load_trainer_weights

        load_trainer_weights(model, args.checkpoint)
        path = args.checkpoint
    return path, model, tokenizer


def model_or_trainer_checkpoint(path: str):
    """(model, tokenizer) in fp32 on CPU from a checkpoint directory, or from a trainer checkpoint
    (`OUT/checkpoints/step-N`, found by its state file) read in the embedded model's architecture."""
    from clover.loading import load_trainer_weights
    from clover.training.checkpointing import STATE_FILE

    trainer_checkpoint = (Path(path) / STATE_FILE).exists()
    _, model, tokenizer = embedded_fp32(None if trainer_checkpoint else path)
    if trainer_checkpoint:
        load_trainer_weights(model, path)
    return model, tokenizer


def embedded_fp32(model_dir=None):
    """(path, model, tokenizer): the checkpoint at `model_dir`, else the embedded model, in fp32 on CPU."""
    import clover
    from clover.loading import LoadOptions, load_model_and_tokenizer

    path = model_dir or clover.default_model_dir()
    model, tokenizer = load_model_and_tokenizer(path, LoadOptions(device="cpu", dtype="fp32"))
    return path, model, tokenizer
