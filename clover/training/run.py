"""`run_recipe`: recipe -> tokenizer, model, data, evaluation -> trained, exported checkpoint.

Run directory (`recipe.output_dir`): `recipe.json` (the resolved recipe), `fit.json` (when
`--fit-minutes` chose the steps), `tokenizer/` (when one is trained), `train.log`, `metrics.jsonl`
(one JSON line per step), `checkpoints/step-*/` (resumable, at any world size), and `final/` (the
exported Clover checkpoint). Works alone or under torchrun; rank 0 writes everything but the
checkpoint shards of other ranks.
"""

import dataclasses
from dataclasses import dataclass
from pathlib import Path

import torch

from .copy_attention import KEY_TARGETS, FactTokens, KeyTokens, joint_fact_tokens, joint_key_tokens
from .line_owner import JOINT_TARGET_TOKENS, OwnerTerms
from .data import BatchSpec, PairDataset
from .distributed import DistInfo, barrier, device_for, init_distributed, shutdown
from .evaluation import combine, loss_evaluator, task_evaluator
from .export import export_checkpoint
from .fit import fit_steps, fitted_config, forget_fit, measure_step_seconds, save_fit
from .grow import (conv_widened_config, experts_widened_config, grow_conv, grow_experts, grow_heads, grow_layers,
                   grown_config, new_conv_scales, new_expert_scales, new_head_scales, widened_config)
from .mining import mine_hard_pairs
from .recipe import ModelRecipe, Recipe, save_recipe
from .sharding import full_state_dict, is_sharded
from .sources import (DIGIT_ROLES, DIGIT_VOCAB, DigitTask, TokenRoles, build_tasks, encode_examples,
                      task_eval_examples, task_train_pairs, tokenizer_roles, weighted_tasks)
from .trainer import Trainer, TrainSummary, log_line


@dataclass(frozen=True)
class RunResult:
    summary: TrainSummary
    run_dir: Path
    export_dir: Path | None  # None on ranks other than 0
    model: torch.nn.Module  # the trained model: whole on rank 0; on other ranks their FSDP shards


def prepare_tokenizer(recipe: Recipe, run_dir: Path, dist: DistInfo):
    """The tokenizer the recipe asks for (None for the digits source). A trained one is saved in
    the run dir by rank 0 and reused on resume."""
    from clover.data.tokenizer import load_tokenizer

    spec = recipe.tokenizer
    if recipe.data.source == "digits":
        return None
    if spec.path or recipe.model.init:
        return load_tokenizer(spec.path or recipe.model.init)
    if not spec.train:
        raise ValueError("recipe.tokenizer needs `path` or `train: true` (or model.init with a tokenizer)")
    saved = run_dir / "tokenizer"
    if dist.is_main and not (saved / "tokenizer.json").exists():
        from clover.data.corpus import tokenizer_corpus, training_examples
        from clover.data.tokenizer import save_tokenizer, train_tokenizer

        tasks = build_tasks(spec.tasks or recipe.data.tasks, recipe.data.task_options)
        texts = tokenizer_corpus(training_examples(spec.n_examples, spec.seed, tasks))
        save_tokenizer(train_tokenizer(texts, spec.vocab_size, spec.spacing), saved)
    barrier(dist)
    return load_tokenizer(saved)


def load_init_model(path: str):
    """A Clover checkpoint to post-train, in fp32."""
    from clover.model import CloverMoeForCausalLM

    return CloverMoeForCausalLM.from_pretrained(path, dtype=torch.float32)


def preset_fields(name: str | None) -> dict:
    from clover.info import PRESETS

    if name is None:
        return {}
    if name not in PRESETS:
        raise ValueError(f"recipe.model.preset={name!r} is unknown; known: {sorted(PRESETS)}")
    return dict(PRESETS[name])


def plan_config(recipe: Recipe):
    """The model config a recipe trains, without building the model (for `--plan`)."""
    from clover.info import config_from_dir
    from clover.model import CloverMoeConfig

    if recipe.model.init:
        grown = grown_config(config_from_dir(recipe.model.init), recipe.model.grow_after)
        widened = widened_config(grown, recipe.model.grow_heads)
        widened = experts_widened_config(widened, recipe.model.grow_experts, recipe.model.grow_shared_expert)
        return conv_widened_config(widened, recipe.model.grow_conv_kernel)
    fields = {**preset_fields(recipe.model.preset), **recipe.model.config}
    if recipe.data.source == "digits":
        fields.setdefault("vocab_size", len(DIGIT_VOCAB))
    elif recipe.tokenizer.train:
        fields.setdefault("vocab_size", recipe.tokenizer.vocab_size)
    fields.setdefault("mask_token_id", 0)
    return CloverMoeConfig(**fields)


def fresh_model(recipe: Recipe, roles: TokenRoles, vocab_size: int):
    """A new model from `recipe.model.config`; special ids and the vocabulary size (unless the
    recipe sets a larger one) come from the tokenizer, or the digits source's own vocabulary."""
    from clover.model import CloverMoeConfig, CloverMoeForCausalLM

    fields = {**preset_fields(recipe.model.preset), **recipe.model.config}
    source = "the digits vocabulary" if recipe.data.source == "digits" else "the tokenizer"
    if fields.get("vocab_size", vocab_size) < vocab_size:
        raise ValueError(f"recipe.model.config.vocab_size={fields['vocab_size']} is smaller than "
                         f"{source} ({vocab_size} tokens)")
    fields.setdefault("vocab_size", vocab_size)
    fields.update(mask_token_id=roles.mask_id, eos_token_id=roles.eos_id, pad_token_id=roles.pad_id,
                  block_size=recipe.train.block_size)
    torch.manual_seed(recipe.train.seed)
    return CloverMoeForCausalLM(CloverMoeConfig(**fields))


def grown_part_scales(model, grow: ModelRecipe) -> dict[str, torch.Tensor] | None:
    """Per-element update multipliers for the parts that growth added at their own learning rate
    (new heads, new expert units, new conv taps), or None when every part trains at the run's rate."""
    scales = {}
    if grow.grow_heads_lr != 1:
        scales.update(new_head_scales(model, grow.grow_heads, grow.grow_heads_lr))
    if grow.grow_experts_lr != 1:
        scales.update(new_expert_scales(model, grow.grow_experts, grow.grow_shared_expert, grow.grow_experts_lr))
    if grow.grow_conv_lr != 1:
        from clover.info import config_from_dir

        old_kernel = config_from_dir(grow.init).linear_conv_kernel_dim
        scales.update(new_conv_scales(model, old_kernel, grow.grow_conv_lr))
    return scales or None


def build_model(recipe: Recipe, tokenizer):
    """(model, token roles): the `init` checkpoint (its mask id wins) or a fresh model."""
    if recipe.model.init:
        model = grow_layers(load_init_model(recipe.model.init), recipe.model.grow_after)
        model = grow_heads(model, recipe.model.grow_heads, split=recipe.model.grow_heads_from == "split")
        model = grow_experts(model, recipe.model.grow_experts, recipe.model.grow_shared_expert)
        model = grow_conv(model, recipe.model.grow_conv_kernel)
        mask_id = model.config.mask_token_id
        if tokenizer is None:
            return model, dataclasses.replace(DIGIT_ROLES, mask_id=mask_id)
        return model, tokenizer_roles(tokenizer, mask_id=mask_id)
    roles = DIGIT_ROLES if tokenizer is None else tokenizer_roles(tokenizer)
    vocab_size = len(DIGIT_VOCAB) if tokenizer is None else len(tokenizer)
    return fresh_model(recipe, roles, vocab_size), roles


def build_data(recipe: Recipe, tokenizer, roles: TokenRoles, model, log=print):
    """(training dataset, eval callback). `log` takes progress lines (hard-example mining)."""
    data, cfg = recipe.data, recipe.train
    spec = BatchSpec(cfg.block_size, roles.eos_id, roles.pad_id, roles.eos_ids)
    if data.source == "digits":
        task = DigitTask(seed=data.seed, **data.digits)
        dataset = PairDataset(task, spec, cfg.batch_size, cfg.seed)
        held_out = DigitTask(seed=data.seed + 1, **data.digits).pairs(0, data.n_eval_per_task)
        return dataset, loss_evaluator(held_out, spec, cfg.alpha, cfg.eps, data.eval_batch_size,
                                       cfg.use_coreset)
    tasks = build_tasks(data.tasks, data.task_options)
    pairs = task_train_pairs(tokenizer, weighted_tasks(tasks, data.task_weights), data.n_train, data.seed,
                             data.enable_thinking, data.thinking_fraction)
    pairs = [p for p in pairs if _fits(p, data)]
    if data.mine_pool:
        pairs += mine_hard_pairs(data, tokenizer, tasks, spec, model, lambda p: _fits(p, data), log)
    dataset = PairDataset(pairs, spec, cfg.batch_size, cfg.seed, group_by_length=data.group_by_length)
    examples = task_eval_examples(tasks, data.n_eval_per_task, data.seed)
    encoded = encode_examples(tokenizer, examples, data.enable_thinking)
    kept = [(e, p) for e, p in zip(examples, encoded) if _fits(p, data)]
    if not kept:
        raise ValueError("every eval example exceeds recipe.data.max_prompt_len / max_response_len")
    examples, held_out = [e for e, _ in kept], [p for _, p in kept]
    evaluators = [loss_evaluator(held_out, spec, cfg.alpha, cfg.eps, data.eval_batch_size, cfg.use_coreset)]
    if data.eval_generate and callable(getattr(model, "generate", None)):
        evaluators.append(task_evaluator(tokenizer, examples, tasks, cfg.block_size,
                                         data.eval_max_new_tokens, data.eval_batch_size,
                                         data.enable_thinking, recipe.generation))
    return dataset, combine(*evaluators)


def _fits(pair, data) -> bool:
    return ((data.max_prompt_len is None or len(pair.prompt_ids) <= data.max_prompt_len)
            and (data.max_response_len is None or len(pair.response_ids) <= data.max_response_len))


def fit_recipe(recipe: Recipe, model, dataset, dist: DistInfo, minutes: float, run_dir: Path,
               key_tokens: KeyTokens | None = None, owner_tokens: OwnerTerms | None = None,
               fact_tokens: FactTokens | None = None) -> Recipe:
    """`recipe` with the steps that fill `minutes` here; the run dir's recipe.json records them."""
    seconds = measure_step_seconds(model, recipe.train, dataset, dist, key_tokens=key_tokens,
                                   owner_tokens=owner_tokens, fact_tokens=fact_tokens)
    train = fit_steps(recipe.train, seconds, minutes)
    fitted = dataclasses.replace(recipe, train=train)
    if dist.is_main:
        save_fit(run_dir, minutes, seconds, recipe.train.steps, train.steps)
        save_recipe(fitted, run_dir / "recipe.json")
        print(f"fit: {seconds:.3f} s/step here, {train.steps} steps fill {minutes:g} minutes", flush=True)
    return fitted


def whole_model(sharded, state: dict, dist: DistInfo):
    """Rank 0: an unsharded copy of an FSDP model carrying `state` (the gathered weights);
    other ranks keep their shards."""
    if not dist.is_main:
        return sharded
    from clover.model import CloverMoeForCausalLM

    model = CloverMoeForCausalLM(sharded.config)
    model.load_state_dict(state)
    return model


def run_recipe(recipe: Recipe, resume: bool = False, max_steps: int | None = None,
               max_minutes: float | None = None, progress: bool = True,
               fit_minutes: float | None = None) -> RunResult:
    """Train and export. `fit_minutes`: first measure the step time here and set
    `train.steps` so that training fills that many minutes (see `fit.py`)."""
    dist = init_distributed(recipe.device)
    try:
        return _run(recipe, dist, resume, max_steps, max_minutes, progress, fit_minutes)
    finally:
        shutdown(dist)


def _run(recipe, dist, resume, max_steps, max_minutes, progress, fit_minutes) -> RunResult:
    if recipe.num_threads:
        torch.set_num_threads(recipe.num_threads)
    run_dir = Path(recipe.output_dir)
    if resume and fit_minutes is None:  # continue the fitted schedule, not the recipe's own steps
        recipe = dataclasses.replace(recipe, train=fitted_config(recipe.train, run_dir))
    if dist.is_main:
        run_dir.mkdir(parents=True, exist_ok=True)
        if not resume and fit_minutes is None:
            forget_fit(run_dir)
        save_recipe(recipe, run_dir / "recipe.json")
    tokenizer = prepare_tokenizer(recipe, run_dir, dist)
    model, roles = build_model(recipe, tokenizer)
    model.to(device_for(dist, recipe.device))
    dataset, eval_fn = build_data(recipe, tokenizer, roles, model,
                                  lambda message: log_line(run_dir, dist, message, echo=True))
    keyed = recipe.train.copy_attention and recipe.train.copy_targets in KEY_TARGETS
    keys = joint_key_tokens(tokenizer, recipe.train.copy_targets) if keyed else None
    owners = tuple(JOINT_TARGET_TOKENS[target](tokenizer) for target in recipe.train.owner_targets) \
        if recipe.train.owner_loss else None
    facts = joint_fact_tokens(tokenizer, recipe.train.fact_copy_targets) if recipe.train.fact_copy else None
    if fit_minutes is not None:
        recipe = fit_recipe(recipe, model, dataset, dist, fit_minutes, run_dir, keys, owners, facts)
    scales = grown_part_scales(model, recipe.model)
    trainer = Trainer(model, recipe.train, dataset, run_dir, eval_fn, dist, progress, scales, keys, owners, facts)
    if resume and not trainer.resume():
        trainer.log("resume requested but no checkpoint found: starting from step 0")
    summary = trainer.train(max_steps=max_steps, max_minutes=max_minutes)
    export_dir = None
    if is_sharded(model):  # gather the shards into a whole model on rank 0
        model = whole_model(model, full_state_dict(model), dist)
    if dist.is_main:
        export_dir = export_checkpoint(model, run_dir / "final", roles.eos_ids, roles.pad_id,
                                       recipe.train.block_size, tokenizer, recipe.export_dtype,
                                       recipe.generation)
        trainer.log(f"exported step {summary.step} to {export_dir}")
    barrier(dist)
    return RunResult(summary, run_dir, export_dir, model)
