"""`clover train` end to end on the clover.data tasks: tokenizer, training, eval, resume, export."""

import json
import re
from pathlib import Path

import pytest
import torch

from clover.cli.main import main
from clover.training.checkpointing import latest_checkpoint, load_model_tensors
from tests.training.conftest import DIGITS_MODEL

TINY = {k: v for k, v in DIGITS_MODEL.items()
        if k not in ("vocab_size", "mask_token_id", "eos_token_id", "pad_token_id")}


def _recipe(tmp_path):
    return {
        "name": "cli-smoke", "output_dir": str(tmp_path / "unused"), "num_threads": 1,
        "model": {"config": TINY},
        "tokenizer": {"train": True, "vocab_size": 400, "n_examples": 200},
        "data": {"tasks": ["joint", "record"], "n_train": 24, "n_eval_per_task": 1,
                 "eval_batch_size": 2, "eval_max_new_tokens": 8, "max_prompt_len": 200,
                 "max_response_len": 80},
        "train": {"steps": 3, "batch_size": 4, "block_size": 8, "lr": 3e-3, "log_interval": 1},
        "generation": {"presence_penalty": 0.0},
    }


def test_train_resume_and_export(tmp_path, capsys):
    recipe = tmp_path / "recipe.json"
    recipe.write_text(json.dumps(_recipe(tmp_path)))
    run = tmp_path / "run"
    args = ["train", str(recipe), "--output", str(run), "--no-progress"]
    assert main(args + ["--max-steps", "2"]) == 0
    assert "step 2 (max_steps)" in capsys.readouterr().out
    assert main(args + ["--resume"]) == 0
    assert "step 3 (done)" in capsys.readouterr().out
    log = (run / "train.log").read_text()
    assert "resumed from" in log and "step-0000002" in log

    from clover.data.tokenizer import load_tokenizer
    from clover.model import CloverMoeForCausalLM

    final = run / "final"
    tok = load_tokenizer(final)
    model = CloverMoeForCausalLM.from_pretrained(final)
    assert model.config.mask_token_id == tok.convert_tokens_to_ids("<|mask|>")
    assert model.config.vocab_size == len(tok) and model.config.block_size == 8
    gen = json.loads((final / "generation_config.json").read_text())
    assert gen["block_size"] == 8 and gen["presence_penalty"] == 0.0
    assert set(gen["eos_token_id"]) == {tok.convert_tokens_to_ids("<|im_end|>"), tok.pad_token_id}
    saved = load_model_tensors(latest_checkpoint(run))
    for name, p in model.state_dict().items():
        torch.testing.assert_close(p, saved[name], rtol=0, atol=0, msg=name)

    # the weights of an earlier checkpoint, loaded into the exported model (to judge a run mid-way)
    from clover.loading import LoadOptions, load_model

    step_2 = run / "checkpoints" / "step-0000002"
    earlier = load_model(final, LoadOptions(device="cpu", dtype="fp32", checkpoint=str(step_2))).state_dict()
    assert any(not torch.equal(earlier[name], p) for name, p in model.state_dict().items())
    for name, p in load_model_tensors(step_2).items():
        torch.testing.assert_close(earlier[name], p, rtol=0, atol=0, msg=name)
    assert main(["generate", "--model", str(final), "--checkpoint", str(run), "hi"]) == 2  # no weights there
    assert "--checkpoint" in capsys.readouterr().err
    metrics = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert any("eval/l_diff" in m for m in metrics)
    assert any("eval/acc/mean" in m for m in metrics)  # task accuracy through model.generate

    # post-train the exported checkpoint: its tokenizer and mask id come with it
    again = tmp_path / "again"
    assert main(["train", str(recipe), "--init", str(final), "--output", str(again), "--no-progress",
                 "--max-steps", "1"]) == 0
    assert "step 1 (max_steps)" in capsys.readouterr().out
    assert not (again / "tokenizer").exists() and (again / "final" / "tokenizer.json").exists()


def test_a_trained_tokenizer_follows_its_spacing_and_tasks(tmp_path):
    """`tokenizer.spacing` and `tokenizer.tasks` reach the trained tokenizer: trained on copy's texts
    alone with trailing spaces, it keeps a copy word whole with its space (a merge learned from
    those texts), while the run's data are other tasks."""
    from clover.data.tasks import get_task
    from clover.data.tokenizer import load_tokenizer

    data = _recipe(tmp_path)
    data["tokenizer"].update(spacing="trailing", tasks=["copy"])
    data["data"].update(max_prompt_len=None, max_response_len=None)  # other tasks' words split into bytes
    data["data"]["task_options"] = {"joint": {"facts": "stated"}}  # the shorter heading: within 256 positions
    recipe = tmp_path / "recipe.json"
    recipe.write_text(json.dumps(data))
    assert main(["train", str(recipe), "--output", str(tmp_path / "run"), "--no-progress", "--max-steps", "0"]) == 0
    tok = load_tokenizer(tmp_path / "run" / "tokenizer")
    prompt = get_task("copy").generate(0, "train").prompt
    pieces = [tok.decode([i]) for i in tok.encode(prompt, add_special_tokens=False)]
    assert "".join(pieces) == prompt and any(p.endswith(" ") and p[:-1].isalpha() for p in pieces)
    assert " " not in pieces[:2]


def test_bad_recipe_is_a_clean_error(tmp_path, capsys):
    recipe = tmp_path / "bad.json"
    recipe.write_text(json.dumps({"model": {"config": TINY}, "train": {"steps": 1}}))
    assert main(["train", str(recipe)]) == 2
    assert "batch_size" in capsys.readouterr().err


@pytest.mark.parametrize("text, message", [
    ('{"model": {"config": {"hidden_size": 32}}, "train": {"steps": 1, "batch_size": 2, "block_size": 4, "lr": "fast"}}',
     "recipe.train.lr: Input should be a valid number (got 'fast')"),
    ('{"model": {"config": {"hidden_size": 32}}, "train": {"steps": "5", "batch_size": 2, "block_size": 4}}',
     "recipe.train.steps: Input should be a valid integer"),
    ('{"model": {"config": {"hidden_size": 32}}, "train": {"steps": 1, "batch_size": 2, "block_size": 4, "strategy": "zero"}}',
     "strategy='zero' must be one of"),
    ('{"model": {"config": {"hidden_size": 32}}, "train": {"steps": 1,}}', "JSON syntax error at line 1"),
])
def test_bad_recipe_is_one_line_and_leaves_nothing(tmp_path, capsys, text, message):
    recipe = tmp_path / "bad.json"
    recipe.write_text(text)
    run = tmp_path / "run"
    assert main(["train", str(recipe), "--output", str(run)]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1, err
    assert not run.exists()


def test_yaml_syntax_error_is_one_line(tmp_path, capsys):
    recipe = tmp_path / "bad.yaml"
    recipe.write_text("model:\n  config: {hidden_size: 32\ntrain: [\n")
    assert main(["train", str(recipe), "--output", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err.strip()
    assert "YAML syntax error at line" in err and len(err.splitlines()) == 1, err
    assert not (tmp_path / "run").exists()


def test_digits_recipe_without_vocab_size_builds_the_digit_vocabulary(tmp_path, capsys):
    from clover.training.recipe import recipe_from_dict
    from clover.training.run import build_model
    from clover.training.sources import DIGIT_ROLES, DIGIT_VOCAB

    data = {"model": {"config": TINY}, "data": {"source": "digits"},
            "train": {"steps": 1, "batch_size": 2, "block_size": 4}}
    model, roles = build_model(recipe_from_dict(data), None)
    assert model.config.vocab_size == len(DIGIT_VOCAB) == 16
    assert model.config.mask_token_id == roles.mask_id == DIGIT_ROLES.mask_id
    small = {**data, "model": {"config": {**TINY, "vocab_size": 8}}}
    with pytest.raises(ValueError, match=r"vocab_size=8 is smaller than the digits vocabulary \(16 tokens\)"):
        build_model(recipe_from_dict(small), None)


def test_plan_prints_the_35b_table(capsys):
    recipe = Path(__file__).resolve().parents[2] / "recipes" / "clover-35b-a3b-fsdp.json"
    assert main(["train", str(recipe), "--plan"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "fits 80 GB" in lines[1] and "fits 141 GB" in lines[1]
    rows = {(r.split()[0], r.split()[1]): r.split() for r in lines[2:-1]}
    assert set(rows) == {("8", "fsdp"), ("8", "ddp"), ("16", "fsdp"), ("16", "ddp")}
    # FSDP splits parameters + gradients + optimizer state (16 bytes per parameter) over the ranks
    assert abs(float(rows[("8", "fsdp")][2]) * 8 - float(rows[("8", "ddp")][2])) < 0.5
    assert rows[("16", "ddp")][-1] == "no" and rows[("16", "fsdp")][-1] == "yes"


def write_digits_recipe(path: Path, steps: int = 1000) -> Path:
    """Write the digits recipe of the fit tests with `steps` training steps to `path`."""
    recipe = {"name": "fit", "num_threads": 1, "model": {"config": TINY},
              "data": {"source": "digits", "n_eval_per_task": 4},
              "train": {"steps": steps, "batch_size": 4, "block_size": 4, "warmup_steps": 1}}
    path.write_text(json.dumps(recipe))
    return path


def _assert_same_weights(run_a, run_b) -> None:
    a, b = (load_model_tensors(latest_checkpoint(run)) for run in (run_a, run_b))
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=0, atol=0, msg=name)


def test_fit_minutes_sets_the_steps_and_leaves_the_run_untouched(tmp_path, capsys):
    """--fit-minutes measures on a throwaway copy: the fitted run equals a plain run of the
    steps it chose (same weights), and recipe.json records those steps."""
    path = write_digits_recipe(tmp_path / "digits.json")
    fitted = tmp_path / "fitted"
    assert main(["train", str(path), "--output", str(fitted), "--no-progress", "--fit-minutes", "0.02"]) == 0
    out = capsys.readouterr().out
    seconds, steps = re.search(r"fit: ([\d.]+) s/step here, (\d+) steps fill 0.02 minutes", out).groups()
    low, high = float(seconds) - 5e-4, float(seconds) + 5e-4  # the printed time is rounded to 1 ms
    assert max(2, int(1.2 / high)) <= int(steps) <= max(2, int(1.2 / low))
    assert f"step {steps} (done)" in out
    resolved = json.loads((fitted / "recipe.json").read_text())
    assert resolved["train"]["steps"] == int(steps)

    plain = tmp_path / "plain"
    write_digits_recipe(path, int(steps))
    assert main(["train", str(path), "--output", str(plain), "--no-progress"]) == 0
    _assert_same_weights(fitted, plain)


def test_resume_continues_the_fitted_schedule(tmp_path, capsys):
    """--resume with the recipe a --fit-minutes run started from continues the fitted steps
    (fit.json): the learning-rate schedule the checkpoint was trained on, and recipe.json keeps
    recording them. Before, the resumed run silently took the recipe's unfitted steps."""
    path = write_digits_recipe(tmp_path / "digits.json")
    run = tmp_path / "run"
    args = ["train", str(path), "--output", str(run), "--no-progress"]
    assert main(args + ["--fit-minutes", "0.01", "--max-steps", "2"]) == 0
    steps = int(re.search(r"(\d+) steps fill", capsys.readouterr().out).group(1))
    assert steps != 1000
    assert main(args + ["--resume"]) == 0
    assert f"step {steps} (done)" in capsys.readouterr().out
    assert json.loads((run / "fit.json").read_text())["steps"] == steps
    assert json.loads((run / "recipe.json").read_text())["train"]["steps"] == steps
    assert "config differs" not in (run / "train.log").read_text()

    plain = tmp_path / "plain"  # the same run in one go, with the fitted steps written out
    write_digits_recipe(path, steps)
    assert main(["train", str(path), "--output", str(plain), "--no-progress"]) == 0
    _assert_same_weights(run, plain)

    capsys.readouterr()  # an edited recipe is a different run: resuming it says so, on the console too
    write_digits_recipe(path, steps + 2)
    assert main(["train", str(path), "--output", str(plain), "--no-progress", "--resume"]) == 0
    out = capsys.readouterr()
    assert f"warning: config differs from the checkpoint's in steps ({steps} -> {steps + 2})" in out.err
    assert f"step {steps + 2} (done)" in out.out
    assert main(args + ["--max-steps", "1"]) == 0  # a fresh unfitted run in the dir drops the old fit
    assert not (run / "fit.json").exists()


def test_fit_minutes_must_be_positive():
    from clover.training.fit import fit_steps
    from clover.training.trainer import TrainConfig

    config = TrainConfig(steps=10, batch_size=2, block_size=4, warmup_steps=5)
    assert fit_steps(config, 0.5, 1.0).steps == 120
    assert fit_steps(config, 100.0, 1.0).steps == 6  # never fewer than warm-up + 1
    with pytest.raises(ValueError, match="--fit-minutes=0 must be positive"):
        fit_steps(config, 0.5, 0)


def test_mining_adds_the_hardest_half_of_each_tasks_pool(tmp_path, capsys):
    """`data.mine_pool`: the run scores a fresh pool with the starting model and logs, for each task
    and turn, how many it kept of how many, and the loss they start at."""
    data = _recipe(tmp_path)
    data["data"].update(mine_pool=16, mine_share=0.5, mine_seed=7)
    recipe = tmp_path / "recipe.json"
    recipe.write_text(json.dumps(data))
    run = tmp_path / "run"
    assert main(["train", str(recipe), "--output", str(run), "--no-progress", "--max-steps", "1"]) == 0
    assert "mining: scored" in capsys.readouterr().err
    kept = re.findall(r"mining: (\w+) \(direct\): kept (\d+) of (\d+), answer loss >= ([\d.]+) nats "
                      r"\(pool mean ([\d.]+), kept mean ([\d.]+)\)", (run / "train.log").read_text())
    assert sorted(k[0] for k in kept) == ["joint", "record"]
    for _, n_kept, n_pool, floor, pool_mean, kept_mean in kept:
        assert int(n_kept) == round(int(n_pool) / 2) and 0 < int(n_pool) <= 8
        assert float(kept_mean) >= float(pool_mean) and float(kept_mean) >= float(floor)


def test_key_supervision_trains_on_keyed_lines_end_to_end(tmp_path):
    """`train.copy_targets: "keys"` with joint's keyed lines: the run finds the key tokens in its own
    tokenizer and logs a positive copy loss on the steps that hold a keyed rule copy."""
    data = _recipe(tmp_path)
    data["data"].update(tasks=["joint"], task_options={"joint": {"line_rules": "keyed", "min_questions": 4}},
                        max_response_len=240, thinking_fraction=1.0)  # every answer with its derivation lines
    data["train"].update(copy_attention=0.1, copy_targets="keys")
    recipe = tmp_path / "recipe.json"
    recipe.write_text(json.dumps(data))
    run = tmp_path / "run"
    assert main(["train", str(recipe), "--output", str(run), "--no-progress"]) == 0
    lines = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    steps = [line for line in lines if "l_copy" in line]  # the training steps (not the final evaluation)
    assert len(steps) == 3 and any(s["l_copy"] > 0 for s in steps)


def test_fact_line_supervision_trains_beside_two_owner_terms_end_to_end(tmp_path):
    """`train.fact_copy` with its head named: the run finds joint's fact-line tokens in its own
    tokenizer (the embedded one: each pilot's name one token) and logs a positive fact loss and fact
    value loss on the steps that hold a fact-line copy; beside it two owner targets from one JSON
    array, whose summed loss is above either one's floor of 0."""
    from clover import default_model_dir

    data = _recipe(tmp_path)
    data["tokenizer"] = {"path": str(default_model_dir())}
    data["data"].update(tasks=["joint"], task_options={"joint": {"min_questions": 4}},
                        max_response_len=240, thinking_fraction=1.0)  # every answer with its derivation lines
    data["train"].update(fact_copy=0.1, fact_copy_heads=[[0, 1]], fact_copy_value=0.1, owner_loss=0.1,
                         owner_target=["pilot", "rule_first"])
    recipe = tmp_path / "recipe.json"
    recipe.write_text(json.dumps(data))
    run = tmp_path / "run"
    assert main(["train", str(recipe), "--output", str(run), "--no-progress"]) == 0
    steps = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    steps = [s for s in steps if "l_fact" in s]
    assert len(steps) == 3 and all(s["l_fact"] > 0 and s["l_fact_value"] > 0 for s in steps)
    assert all(s["l_copy"] == 0 and s["l_owner"] > 0 for s in steps)
    assert json.loads((run / "recipe.json").read_text())["train"]["owner_target"] == ["pilot", "rule_first"]
