"""Recipes: strict parsing, YAML, overrides; the shipped recipes parse and build a model."""

import dataclasses
import json
from pathlib import Path

import pytest

from clover.training.recipe import load_recipe, recipe_from_dict
from clover.training.trainer import TrainConfig

ROOT = Path(__file__).resolve().parents[2]
MINIMAL = {"model": {"config": {"hidden_size": 32}}, "train": {"steps": 2, "batch_size": 2, "block_size": 4}}


def test_minimal_recipe_and_defaults():
    recipe = recipe_from_dict(MINIMAL)
    assert recipe.train == TrainConfig(steps=2, batch_size=2, block_size=4)
    assert recipe.data.source == "tasks" and recipe.model.init is None
    moved = recipe.with_overrides(init="ckpt", output_dir="out")
    assert moved.model.init == "ckpt" and moved.output_dir == "out" and recipe.output_dir != "out"


@pytest.mark.parametrize("change, message", [
    ({"train": {"steps": 2, "batch_size": 2, "block_size": 4, "lr_max": 1}},
     r"recipe.train: unknown key\(s\) \['lr_max'\]"),
    ({"colour": "red"}, r"unknown key\(s\) \['colour'\]"),
    ({"model": {}}, "needs `config`"),
    ({"data": {"source": "web"}}, "source='web'"),
    ({"train": {"steps": 2, "batch_size": 2, "block_size": 4, "dtype": "fp8"}}, "dtype='fp8'"),
    ({"train": {"steps": 2, "batch_size": 2, "block_size": 4, "eps": 0.1, "max_level": 0.05}},
     r"max_level=0.05 must be in \(eps=0.1, 1\]"),
    ({"train": {"steps": 2, "batch_size": 2, "block_size": 4, "max_level_share": -0.5}},
     r"max_level_share=-0.5 must be in \[0, 1\]"),
    ({"train": {"steps": 2, "batch_size": 2, "block_size": 4, "max_level_per": "row"}},
     r"max_level_per='row' must be one of \('block', 'step'\)"),
    ({"model": {"config": {"hidden_size": 32}, "grow_after": [1]}}, r"grow_after=\[1\] needs `init`"),
    ({"model": {"config": {"hidden_size": 32}, "grow_heads": 4}}, r"grow_heads=4 needs `init`"),
    ({"model": {"init": "x", "grow_heads": 4, "grow_heads_from": "copy"}},
     r"grow_heads_from='copy' must be one of \('fresh', 'split'\)"),
    ({"model": {"init": "x", "grow_heads": 4, "grow_heads_lr": 0}}, r"grow_heads_lr=0.0 must be > 0"),
    ({"model": {"init": "x", "grow_heads_lr": 10}}, r"grow_heads_lr=10.0 needs grow_heads"),
    ({"model": {"config": {"hidden_size": 32}, "grow_experts": 8}}, r"grow_experts=8 needs `init`"),
    ({"model": {"init": "x", "grow_shared_expert": -2}}, r"grow_shared_expert=-2 must be >= 0"),
    ({"model": {"init": "x", "grow_experts": 8, "grow_experts_lr": -1}}, r"grow_experts_lr=-1.0 must be > 0"),
    ({"model": {"init": "x", "grow_experts_lr": 10}}, r"grow_experts_lr=10.0 needs grow_experts or grow_shared_expert"),
    ({"data": {"mine_pool": -1}}, r"mine_pool=-1 must be >= 0"),
    ({"data": {"mine_pool": 10, "mine_seed": 1, "mine_share": 0}}, r"mine_share=0.0 must be in \(0, 1\]"),
    ({"data": {"mine_pool": 10}}, r"mine_seed=None must be set and differ from recipe.data.seed=0"),
    ({"data": {"mine_pool": 10, "seed": 4, "mine_seed": 4}}, r"mine_seed=4 must be set and differ"),
    ({"data": {"source": "digits", "mine_pool": 10, "mine_seed": 1}}, r"mine_pool needs source 'tasks'"),
    ({"data": {"tasks": ["joint"], "task_weights": {"record": 2}}}, r"task_weights=\{'record': 2\}"),
    ({"data": {"task_weights": {"joint": 0}}}, r"task_weights=\{'joint': 0\}"),
    ({"data": {"task_weights": {"jiont": 2}}}, r"task_weights=\{'jiont': 2\}.*'joint'"),  # all tasks
    ({"tokenizer": {"train": True, "spacing": "tabs"}}, r"spacing='tabs' must be one of \['own', 'trailing'"),
    ({"tokenizer": {"train": True, "tasks": ["jiont"]}}, r"tokenizer.tasks: unknown task\(s\) \['jiont'\]"),
])
def test_bad_recipes_name_the_problem(change, message):
    with pytest.raises(ValueError, match=message):
        recipe_from_dict({**MINIMAL, **change})


def test_task_weights_repeat_a_task_in_the_mixture_cycle():
    from clover.data.corpus import training_examples
    from clover.training.sources import build_tasks, weighted_tasks

    tasks = weighted_tasks(build_tasks(["record", "joint"]), {"joint": 3})
    assert [t.name for t in tasks] == ["record", "joint", "joint", "joint"]
    names = [e.task for e in training_examples(400, seed=0, tasks=tasks)]
    assert names.count("joint") == 300 and len({e.prompt for e in training_examples(400, 0, tasks)}) == 400


def test_yaml_and_json_load_the_same(tmp_path):
    yaml = pytest.importorskip("yaml")
    data = {**MINIMAL, "train": {**MINIMAL["train"], "betas": [0.9, 0.99]}}
    (tmp_path / "r.yaml").write_text(yaml.safe_dump(data))
    (tmp_path / "r.json").write_text(json.dumps(data))
    assert load_recipe(tmp_path / "r.yaml") == load_recipe(tmp_path / "r.json")
    assert load_recipe(tmp_path / "r.json").train.betas == (0.9, 0.99)


@pytest.mark.parametrize("path", sorted((ROOT / "recipes").glob("*.json")), ids=lambda p: p.stem)
def test_every_shipped_recipe_parses_and_builds_its_tasks(path):
    """A typo in a task option (`"checks": true` for a layout name) fails here, not an hour into a run."""
    from clover.training.sources import build_tasks

    recipe = load_recipe(path)
    if recipe.data.source == "tasks":
        tasks = build_tasks(recipe.data.tasks, recipe.data.task_options)
        assert tasks and all(t.generate(0, "train").answer for t in tasks)  # no tasks named: all of them


def test_embedded_recipe_builds_a_small_model():
    from clover.model import CloverMoeConfig, CloverMoeForCausalLM

    recipe = load_recipe(ROOT / "recipes" / "embedded_ar.json")  # stage 1 builds the model
    config = CloverMoeConfig(**{**recipe.model.config, "vocab_size": 3000, "mask_token_id": 7,
                                "block_size": recipe.train.block_size})
    assert set(config.layer_types) == {"linear_attention", "full_attention"}  # both mixers exercised
    params = sum(p.numel() for p in CloverMoeForCausalLM(config).parameters())
    assert params * 4 <= 20e6  # fp32 bytes, even with a 3000-token vocabulary


def test_embedded_stage_two_starts_from_stage_one():
    stage1 = load_recipe(ROOT / "recipes" / "embedded_ar.json")
    stage2 = load_recipe(ROOT / "recipes" / "embedded.json")
    assert stage1.train.alpha == 0 and stage2.train.alpha > 0  # AR first, then joint
    assert stage2.model.init == f"{stage1.output_dir}/final"
    assert "copy" in stage1.data.tasks and "copy" not in stage2.data.tasks


def test_embedded_stage_three_continues_stage_two():
    stage2 = load_recipe(ROOT / "recipes" / "embedded.json")
    stage3 = load_recipe(ROOT / "recipes" / "embedded_polish.json")
    assert stage3.model.init == f"{stage2.output_dir}/final"
    assert stage3.train.alpha == stage2.train.alpha and stage3.train.lr < stage2.train.lr
    assert stage3.data.seed != stage2.data.seed  # fresh examples
    stage4 = load_recipe(ROOT / "recipes" / "embedded_polish_cpu.json")
    assert stage4.model.init == f"{stage3.output_dir}/final" and stage4.device == "cpu"
    assert stage4.data.seed not in (stage2.data.seed, stage3.data.seed)


def test_embedded_stage_seven_grows_stage_six_within_the_size_limit():
    import torch

    from clover.model import CloverMoeConfig, CloverMoeForCausalLM
    from clover.training.grow import grown_config

    stage1 = load_recipe(ROOT / "recipes" / "embedded_ar.json")  # stages 2-6 keep its architecture
    stage6 = load_recipe(ROOT / "recipes" / "embedded_reason2_cpu.json")
    stage7 = load_recipe(ROOT / "recipes" / "embedded_grow_cpu.json")
    assert stage7.model.init == f"{stage6.output_dir}/final"
    assert stage7.data.seed != stage6.data.seed and stage7.data.tasks == stage6.data.tasks
    config = grown_config(CloverMoeConfig(**{**stage1.model.config, "vocab_size": 743,  # its tokenizer's
                                         "mask_token_id": 7}),
                          stage7.model.grow_after)
    assert config.num_hidden_layers == 6 and config.layer_types.count("full_attention") == 4
    with torch.device("meta"):
        params = sum(p.numel() for p in CloverMoeForCausalLM(config).parameters())
    assert params * 4 <= 25e6  # fp32 bytes: the package limit


EMBEDDED_STAGES = ("embedded_ar", "embedded", "embedded_polish", "embedded_polish_cpu", "embedded_reason_cpu",
                   "embedded_reason2_cpu", "embedded_grow_cpu", "embedded_grow2_cpu")  # in training order


def test_embedded_stages_chain_on_fresh_data():
    """Every embedded recipe is a stage of one chain: each starts from the export of the stage
    before and draws its examples with a data seed no other stage used."""
    parents = dict(zip(EMBEDDED_STAGES, (None, *EMBEDDED_STAGES[:-1])))
    assert staged_recipes("embedded", parents)[EMBEDDED_STAGES[0]].model.init is None


Parent = str | tuple[str, ...] | None  # a stage, the mean of stages' exports, or none (a fresh model)


def staged_recipes(prefix: str, parents: dict[str, Parent], committed: dict[Parent, str] | None = None) -> dict:
    """The recipes named in `parents` (all of recipes/PREFIX*.json) by name, after checking that each
    starts fresh (parent None), from its parent's export (the run's, or the copy `committed` names),
    or, where the parent is a tuple of stages, from the committed mean of their exports; and that
    each draws its examples with a data seed of its own."""
    assert {p.stem for p in (ROOT / "recipes").glob(f"{prefix}*.json")} == set(parents)
    stages = {name: load_recipe(ROOT / "recipes" / f"{name}.json") for name in parents}
    for name, parent in parents.items():
        if parent is None:
            assert stages[name].model.init is None, name
            continue
        if isinstance(parent, tuple):
            assert set(parent) <= set(parents) and stages[name].model.init == committed[parent], name
            continue
        run_export = f"{stages[parent].output_dir}/final"
        assert stages[name].model.init in (run_export, (committed or {}).get(parent, run_export)), name
    seeds = [stage.data.seed for stage in stages.values()]
    assert len(set(seeds)) == len(seeds), seeds
    return stages


# The second lineage is a tree: each recipe, and the recipe whose export it starts from (None: fresh;
# a tuple: the committed mean of those recipes' exports).
FIRST_AVERAGE = ("curriculum_soup_a_cpu", "curriculum_soup_b_cpu")
SECOND_AVERAGE = ("curriculum_soup2_a_cpu", "curriculum_soup2_b_cpu")
CURRICULUM_PARENTS = {
    "curriculum_check_cpu": None,
    "curriculum_joint_cpu": "curriculum_check_cpu",
    "curriculum_mix_cpu": "curriculum_joint_cpu",
    "curriculum_more_cpu": "curriculum_mix_cpu",
    "curriculum_block_cpu": "curriculum_mix_cpu",
    "curriculum_copy_cpu": "curriculum_more_cpu",
    "curriculum_pilot_cpu": "curriculum_more_cpu",
    "curriculum_recover_cpu": "curriculum_pilot_cpu",
    "curriculum_copy_block_cpu": "curriculum_copy_cpu",
    "curriculum_copy_block2_cpu": "curriculum_copy_block_cpu",
    "curriculum_block_heavy_cpu": "curriculum_copy_block_cpu",
    "curriculum_block_heavy2_cpu": "curriculum_block_heavy_cpu",
    "curriculum_anneal_cpu": "curriculum_block_heavy_cpu",
    "curriculum_anneal_long_cpu": "curriculum_block_heavy2_cpu",
    "curriculum_anneal2_cpu": "curriculum_anneal_cpu",
    "curriculum_low_levels_cpu": "curriculum_anneal2_cpu",
    "curriculum_polish_cpu": "curriculum_anneal2_cpu",
    "curriculum_grow_cpu": "curriculum_polish_cpu",
    "curriculum_suffix_cpu": "curriculum_polish_cpu",
    "curriculum_suffix2_cpu": "curriculum_suffix_cpu",
    "curriculum_suffix3_cpu": "curriculum_suffix_cpu",
    "curriculum_suffix4_cpu": "curriculum_suffix3_cpu",
    "curriculum_lookups_cpu": "curriculum_suffix3_cpu",
    "curriculum_suffix5_cpu": "curriculum_suffix4_cpu",
    "curriculum_keyed_rules_cpu": "curriculum_suffix5_cpu",
    "curriculum_keyed_lines_cpu": "curriculum_suffix5_cpu",
    "curriculum_radii_cpu": "curriculum_suffix5_cpu",
    "curriculum_suffix6_cpu": "curriculum_suffix5_cpu",
    "curriculum_suffix7_cpu": "curriculum_suffix6_cpu",
    "curriculum_joint6_cpu": "curriculum_suffix6_cpu",
    "curriculum_suffix8_cpu": "curriculum_suffix7_cpu",
    "curriculum_joint6b_cpu": "curriculum_suffix7_cpu",
    "curriculum_suffix9_cpu": "curriculum_suffix8_cpu",
    "curriculum_long_cpu": "curriculum_suffix8_cpu",
    "curriculum_suffix10_cpu": "curriculum_suffix9_cpu",
    "curriculum_suffix11_cpu": "curriculum_suffix10_cpu",
    "curriculum_anneal3_cpu": "curriculum_suffix10_cpu",
    "curriculum_anneal3_joint_cpu": "curriculum_suffix10_cpu",
    "curriculum_gpu_b128": "curriculum_suffix10_cpu",
    "curriculum_gpu_grow6": "curriculum_suffix10_cpu",
    "curriculum_gpu_b512": "curriculum_suffix10_cpu",
    "curriculum_gpu_grow6_cpu": "curriculum_gpu_grow6",
    "curriculum_gpu_grow6_anneal_cpu": "curriculum_gpu_grow6",
    "curriculum_pilots2_cpu": "curriculum_suffix10_cpu",
    "curriculum_pilots3_cpu": "curriculum_suffix10_cpu",
    "curriculum_fresh_mix_gpu": "curriculum_check_cpu",
    "curriculum_fresh_block_gpu": "curriculum_fresh_mix_gpu",
    "curriculum_fresh_mix_cpu": "curriculum_check_cpu",
    "curriculum_soup_a_cpu": "curriculum_suffix10_cpu",
    "curriculum_soup_b_cpu": "curriculum_suffix10_cpu",
    "curriculum_soup2_a_cpu": FIRST_AVERAGE,
    "curriculum_soup2_b_cpu": FIRST_AVERAGE,
    "curriculum_soup3_a_cpu": SECOND_AVERAGE,
    "curriculum_soup3_b_cpu": SECOND_AVERAGE,
}
# Exports committed so that a later session starts from them instead of rerunning the stages before.
COMMITTED_EXPORTS = {"curriculum_mix_cpu": "checkpoints/curriculum-mix",
                     "curriculum_copy_cpu": "checkpoints/curriculum-copy",
                     "curriculum_copy_block_cpu": "checkpoints/curriculum-copy-block",
                     "curriculum_block_heavy_cpu": "checkpoints/curriculum-block-heavy",
                     "curriculum_polish_cpu": "checkpoints/curriculum-polish",
                     "curriculum_suffix3_cpu": "checkpoints/curriculum-suffix3",
                     FIRST_AVERAGE: "checkpoints/curriculum-soup",
                     SECOND_AVERAGE: "checkpoints/curriculum-soup2"}


def test_curriculum_stages_teach_the_base_check_first():
    """The second lineage starts fresh on `joint`'s base questions alone (AR loss); every later
    stage starts from the export of its parent stage (the run's, or the committed copy of it; for a
    later averaging round, the committed mean of the round before's two exports) and draws its
    examples with a data seed no other stage used."""
    stages = staged_recipes("curriculum", CURRICULUM_PARENTS, COMMITTED_EXPORTS)
    first = stages["curriculum_check_cpu"]
    assert first.train.alpha == 0 and first.data.tasks == ("joint",)
    assert first.data.task_options["joint"]["ask_derived"] is False
    assert all(stage.data.task_options["joint"].get("ask_derived", True)
               for stage in stages.values() if stage is not first and "joint" in stage.data.tasks)


@pytest.mark.parametrize("export", sorted(COMMITTED_EXPORTS.values()))
def test_the_committed_curriculum_checkpoints_have_the_lineage_architecture(export):
    """Each committed export (where a later stage of the lineage starts) loads with the shipped
    tokenizer's vocabulary and stage 1's widths, in 4 layers."""
    from clover.model import CloverMoeForCausalLM

    first = load_recipe(ROOT / "recipes" / "curriculum_check_cpu.json")
    model = CloverMoeForCausalLM.from_pretrained(ROOT / export)
    shipped = CloverMoeForCausalLM.config_class.from_pretrained(ROOT / "clover" / "assets" / "clover-tiny")
    assert model.config.num_hidden_layers == 4 and model.config.vocab_size == shipped.vocab_size
    assert {k: getattr(model.config, k) for k in first.model.config if k != "rope_parameters"} == {
        k: v for k, v in first.model.config.items() if k != "rope_parameters"}


# The third lineage: words carry a space (tokenizer `spacing`), from stage 1 of the second lineage's recipe.
SPACED_PARENTS = {
    "spaced_trailing_check_cpu": None,
    "spaced_leading_check_cpu": None,
    "spaced_trailing_mix_gpu": "spaced_trailing_check_cpu",
    "spaced_trailing_block_gpu": "spaced_trailing_mix_gpu",
    "spaced_trailing_mix_cpu": "spaced_trailing_check_cpu",
    "spaced_trailing_block_cpu": "spaced_trailing_mix_cpu",
    "spaced_trailing_block_direct_gpu": "spaced_trailing_mix_cpu",
    "spaced_trailing_block_direct_b64_gpu": "spaced_trailing_mix_cpu",
    "spaced_trailing_block_more_gpu": "spaced_trailing_block_direct_b64_gpu",
    "spaced_trailing_block_joint_gpu": "spaced_trailing_block_direct_b64_gpu",
    "spaced_trailing_anneal_cpu": "spaced_trailing_block_more_gpu",
    "spaced_trailing_suffix_cpu": "spaced_trailing_block_more_gpu",
    "spaced_trailing_airspace_cpu": "spaced_trailing_anneal_cpu",
    "spaced_trailing_airspace_low_cpu": "spaced_trailing_anneal_cpu",
    "spaced_trailing_amendments_cpu": "spaced_trailing_anneal_cpu",
    "spaced_trailing_more_cpu": "spaced_trailing_anneal_cpu",
    "spaced_trailing_more_low_cpu": "spaced_trailing_more_cpu",
    "spaced_trailing_more2_cpu": "spaced_trailing_more_cpu",
    "spaced_trailing_more3_cpu": "spaced_trailing_more_cpu",
    "spaced_trailing_long_cpu": "spaced_trailing_more_cpu",
    "spaced_trailing_long_low_cpu": "spaced_trailing_more_cpu",
}
SPACED_EXPORTS = {
    "spaced_trailing_mix_cpu": "checkpoints/spaced-trailing-mix",
    "spaced_trailing_block_more_gpu": "checkpoints/spaced-trailing-block-more",
    "spaced_trailing_anneal_cpu": "checkpoints/spaced-trailing-anneal",
    "spaced_trailing_more_cpu": "checkpoints/spaced-trailing-more",
}


def test_spaced_stages_differ_from_the_second_lineage_in_the_tokenizer_alone():
    """The spaced lineage's first stages are the second lineage's stage 1 with a tokenizer trained on
    all four tasks' texts with words that carry a space, and its GPU stages the control's
    (curriculum_fresh_*): the same model, data and schedule, the tokenizer and data seeds apart."""
    stages = staged_recipes("spaced", SPACED_PARENTS, SPACED_EXPORTS)
    control = load_recipe(ROOT / "recipes" / "curriculum_check_cpu.json")
    for spacing in ("trailing", "leading"):
        first = stages[f"spaced_{spacing}_check_cpu"]
        assert first.tokenizer.train and first.tokenizer.spacing == spacing
        assert set(first.tokenizer.tasks) == {"copy", "airspace", "joint", "record"}
        assert first.model == control.model and first.train.lr == control.train.lr
    for stage in ("mix_gpu", "block_gpu", "mix_cpu"):
        spaced, fresh = (load_recipe(ROOT / "recipes" / f"{prefix}_{stage}.json")
                         for prefix in ("spaced_trailing", "curriculum_fresh"))
        assert dataclasses.replace(spaced.train, seed=0) == dataclasses.replace(fresh.train, seed=0)
        assert dataclasses.replace(spaced.data, seed=0) == dataclasses.replace(fresh.data, seed=0)


# Probes of the second lineage's stage 1: each differs from it in these model config values alone.
STAGE_1_PROBES = {
    "rotary_check_cpu": {"rope_parameters": {"rope_type": "default", "rope_theta": 10000.0,
                                             "partial_rotary_factor": 0.25}},  # Qwen3.5's value
    "wide_check_cpu": {"head_dim": 48},
}


@pytest.mark.parametrize("name", sorted(STAGE_1_PROBES))
def test_a_stage_1_probe_differs_from_the_second_lineage_stage_1_in_its_model_change_alone(name):
    """A probe is the second lineage's stage 1 (same data seed, schedule and tokenizer) with one
    change to the model, so that its losses compare with stage 1's step by step
    (`benchmarks/paired_loss.py`)."""
    probe, stage1 = (load_recipe(ROOT / "recipes" / f"{n}.json") for n in (name, "curriculum_check_cpu"))
    assert probe.train == stage1.train and probe.data == stage1.data and probe.tokenizer == stage1.tokenizer
    change = STAGE_1_PROBES[name]
    assert all(stage1.model.config[key] != value for key, value in change.items())
    assert probe.model == dataclasses.replace(stage1.model, config={**stage1.model.config, **change})


# Width probes of the embedded model: each is a third-round continuation with added attention heads.
HEADS_PROBES = {"heads_a_cpu": "curriculum_soup3_a_cpu", "heads_b_cpu": "curriculum_soup3_b_cpu",
                "heads_split_a_cpu": "curriculum_soup3_a_cpu", "heads_split_b_cpu": "curriculum_soup3_b_cpu",
                "heads_lr_a_cpu": "curriculum_soup3_a_cpu", "heads_lr_b_cpu": "curriculum_soup3_b_cpu"}


@pytest.mark.parametrize("name", sorted(HEADS_PROBES))
def test_a_heads_probe_differs_from_its_continuation_in_the_added_heads_alone(name):
    """Same init, data seed, noise and schedule as the continuation it pairs with, so that their
    losses and their evals compare step by step; only the added heads differ."""
    probe, control = (load_recipe(ROOT / "recipes" / f"{n}.json") for n in (name, HEADS_PROBES[name]))
    assert probe.train == control.train and probe.data == control.data and probe.tokenizer == control.tokenizer
    assert probe.model.grow_heads > 0 and control.model.grow_heads == 0
    assert probe.model == dataclasses.replace(control.model, grow_heads=probe.model.grow_heads,
                                              grow_heads_from=probe.model.grow_heads_from,
                                              grow_heads_lr=probe.model.grow_heads_lr)


# Hard-example mining probes: third-round continuations whose data adds the starting model's hardest
# examples (clover.training.mining) to fewer fresh ones, over as many examples as their steps take.
MINE_PROBES = {"mine_a_cpu": "curriculum_soup3_a_cpu", "mine_b_cpu": "curriculum_soup3_b_cpu"}


@pytest.mark.parametrize("name", sorted(MINE_PROBES))
def test_a_mining_probe_is_its_continuation_with_mined_data(name):
    probe, control = (load_recipe(ROOT / "recipes" / f"{n}.json") for n in (name, MINE_PROBES[name]))
    assert probe.model == control.model and probe.tokenizer == control.tokenizer
    assert probe.train == dataclasses.replace(control.train, steps=probe.train.steps)
    data = probe.data
    assert data.mine_pool > 0 and data.mine_seed not in (data.seed, control.data.seed)
    assert data == dataclasses.replace(control.data, n_train=data.n_train, mine_pool=data.mine_pool,
                                       mine_share=data.mine_share, mine_seed=data.mine_seed)
    examples = data.n_train + round(data.mine_share * data.mine_pool)
    assert probe.train.steps * probe.train.batch_size == examples  # one pass


# Wider-experts probes: the mining probes with fresh units in every routed and shared expert.
EXPERTS_PROBES = {"experts_a_cpu": "mine_a_cpu", "experts_b_cpu": "mine_b_cpu"}


@pytest.mark.parametrize("name", sorted(EXPERTS_PROBES))
def test_an_experts_probe_differs_from_its_mining_run_in_the_added_units_alone(name):
    """Same init, mined data, noise and recipe steps as the mining run it pairs with, so that their
    losses compare step by step; only the added expert units (and their rate) differ."""
    probe, control = (load_recipe(ROOT / "recipes" / f"{n}.json") for n in (name, EXPERTS_PROBES[name]))
    assert probe.train == control.train and probe.data == control.data and probe.tokenizer == control.tokenizer
    assert probe.model.grow_experts > 0 and probe.model.grow_shared_expert > 0 and control.model.grow_experts == 0
    assert probe.model == dataclasses.replace(control.model, grow_experts=probe.model.grow_experts,
                                              grow_shared_expert=probe.model.grow_shared_expert,
                                              grow_experts_lr=probe.model.grow_experts_lr)


# Drill probes: third-round continuations with the `rules` drill (clover.data.tasks.rules) in the mix.
def test_the_drill_probe_is_its_continuation_with_the_drill_added_to_the_mix():
    """Same init, schedule, data seed and weights for the other tasks as the continuation it
    pairs with; only the drill joins the mix."""
    probe, control = (load_recipe(ROOT / "recipes" / f"{n}.json") for n in ("rules_a_cpu", "curriculum_soup3_a_cpu"))
    assert probe.model == control.model and probe.train == control.train and probe.tokenizer == control.tokenizer
    assert probe.data.task_weights == {**control.data.task_weights, "rules": 2}
    assert probe.data == dataclasses.replace(control.data, tasks=(*control.data.tasks, "rules"),
                                             task_weights=probe.data.task_weights)


def test_the_keyed_drill_probe_differs_from_the_drill_probe_in_the_rules_form_alone():
    probe, control = (load_recipe(ROOT / "recipes" / f"{n}.json") for n in ("rules_keyed_cpu", "rules_a_cpu"))
    assert probe.model == control.model and probe.train == control.train and probe.tokenizer == control.tokenizer
    assert "rules" not in control.data.task_options
    assert probe.data == dataclasses.replace(
        control.data, task_options={**control.data.task_options, "rules": {"rules": "keyed"}})


def test_the_scan_runs_are_the_third_round_continuation_with_joint_derived_by_scan():
    """Same init, mix, batch and length as `curriculum_soup3_a_cpu`; joint's derivations scan the
    rules (`derive: scan`); the two runs differ in learning rate and seeds only."""
    a, b, control = (load_recipe(ROOT / "recipes" / f"{n}.json")
                     for n in ("scan_a_cpu", "scan_b_cpu", "curriculum_soup3_a_cpu"))
    assert a.model == b.model == control.model and a.tokenizer == control.tokenizer
    options = {**control.data.task_options, "joint": {**control.data.task_options["joint"], "derive": "scan"}}
    for run, lr, seed in ((a, 3e-4, 133), (b, 5e-4, 134)):
        assert run.train == dataclasses.replace(control.train, lr=lr, seed=seed)
        assert run.data == dataclasses.replace(control.data, task_options=options, seed=seed)


def test_the_copy_runs_are_the_third_round_s_run_a_with_copy_supervision():
    """`curriculum_soup3_a_cpu`'s data and seeds, plus the copy supervision's loss at weight 0.1: over
    any head for its 4,000 steps (a paired comparison with that run), or confined to the two heads
    that copy in the other tasks, over 3,000 steps."""
    control = load_recipe(ROOT / "recipes" / "curriculum_soup3_a_cpu.json")
    for name, changes in (("copy_a_cpu", dict(copy_attention=0.1)),
                          ("copy_b_cpu", dict(copy_attention=0.1, copy_heads=((0, 5), (1, 2)), steps=3000))):
        run = load_recipe(ROOT / "recipes" / f"{name}.json")
        assert run.model == control.model and run.tokenizer == control.tokenizer and run.data == control.data
        assert run.train == dataclasses.replace(control.train, **changes)


def test_the_decay_runs_are_the_third_round_s_run_a_at_a_stronger_weight_decay():
    """`curriculum_soup3_a_cpu` step for step (same init, data, seeds and schedule), with AdamW's
    weight decay at 0.3 or 1.0 in place of 0.01."""
    control = load_recipe(ROOT / "recipes" / "curriculum_soup3_a_cpu.json")
    for name, decay in (("decay_a_cpu", 0.3), ("decay_b_cpu", 1.0)):
        run = load_recipe(ROOT / "recipes" / f"{name}.json")
        assert run.model == control.model and run.tokenizer == control.tokenizer and run.data == control.data
        assert run.train == dataclasses.replace(control.train, weight_decay=decay)


def test_the_keyed_lines_run_is_the_third_round_s_run_a_with_joint_s_lines_keyed():
    """`curriculum_soup3_a_cpu` step for step, with joint's derivation lines writing their rules
    property first (`line_rules: keyed`); the prompts keep their sentences."""
    run, control = (load_recipe(ROOT / "recipes" / f"{n}.json") for n in ("keyed_lines_cpu", "curriculum_soup3_a_cpu"))
    assert run.model == control.model and run.tokenizer == control.tokenizer and run.train == control.train
    joint = {**control.data.task_options["joint"], "line_rules": "keyed"}
    assert run.data == dataclasses.replace(control.data, task_options={**control.data.task_options, "joint": joint})


def test_the_keyed_lookups_run_is_the_keyed_lines_run_with_copy_supervision_on_the_keys():
    run, control = (load_recipe(ROOT / "recipes" / f"{n}.json") for n in ("keyed_lookups_cpu", "keyed_lines_cpu"))
    assert run.model == control.model and run.tokenizer == control.tokenizer and run.data == control.data
    assert run.train == dataclasses.replace(control.train, steps=3000, copy_attention=0.1, copy_targets="keys")


def test_the_lookup_head_runs_continue_the_keyed_lines_run_from_fitted_layers_at_a_lower_rate():
    """The keyed-lines run's data and seeds, from checkpoints with a fitted lookup layer
    (`benchmarks/lookup_head.py`), at lr 1e-4 for 2,500 (a) or 1,500 steps."""
    control = load_recipe(ROOT / "recipes" / "keyed_lines_cpu.json")
    for name, init, steps in (("lookup_head_a_cpu", "checkpoints/lookup-head", 2500),
                              ("lookup_head_b_cpu", "checkpoints/lookup-head-b", 1500),
                              ("lookup_head_facts_cpu", "checkpoints/lookup-head-facts", 1500)):
        run = load_recipe(ROOT / "recipes" / f"{name}.json")
        assert run.model == dataclasses.replace(control.model, init=init), name
        assert run.tokenizer == control.tokenizer and run.data == control.data, name
        assert run.train == dataclasses.replace(control.train, steps=steps, lr=1e-4), name


def test_the_second_lookup_head_run_continues_run_a_on_fresh_data():
    run, control = (load_recipe(ROOT / "recipes" / f"{n}.json") for n in ("lookup_head_a2_cpu", "lookup_head_a_cpu"))
    assert run.model == dataclasses.replace(control.model, init=f"{control.output_dir}/final")
    assert run.tokenizer == control.tokenizer and run.data == dataclasses.replace(control.data, seed=133)
    assert run.train == dataclasses.replace(control.train, steps=1000, seed=133)


# The embedded model since the second average: each recipe, the export it starts from (`clover average
# OUT RUN/checkpoints/step-N --base checkpoints/curriculum-soup2` of the parent run at step N) and N.
SHIPPED_LINEAGE = (("asked_a_cpu", "checkpoints/curriculum-soup2", None),
                   ("first_c_cpu", "runs/asked-a-1000", 1000),
                   ("first_h_cpu", "runs/first-c-500", 500),
                   ("first_j_cpu", "checkpoints/first-h-1000", 1000),
                   ("counted_b_cpu", "checkpoints/first-j-1000", 1000),
                   ("counted_c_cpu", "checkpoints/counted-b-1500", 1500))


def test_the_shipped_lineage_continues_the_second_average_from_committed_or_named_steps():
    stages = [(load_recipe(ROOT / "recipes" / f"{name}.json"), init, step) for name, init, step in SHIPPED_LINEAGE]
    for (parent, _, _), (recipe, init, step) in zip(stages, stages[1:]):
        assert recipe.model.init == init and init.endswith(f"-{step}") and step <= parent.train.steps
        assert parent.output_dir.replace("_", "-") + f"-{step}" == init.replace("checkpoints/", "runs/")
    assert all((ROOT / "checkpoints" / name).is_dir() for name in ("curriculum-soup2", "first-h-1000", "first-j-1000",
                                                                    "counted-b-1500"))
    seeds = [recipe.data.seed for recipe, _, _ in stages]
    assert len(set(seeds)) == len(seeds), seeds
