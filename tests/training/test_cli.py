"""`clover train` end to end on the clover.data tasks: tokenizer, training, eval, resume, export."""

import json

import torch

from clover.cli.main import main
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
    assert "resumed from" in log and "step-0000002.pt" in log

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
    state = torch.load(sorted((run / "checkpoints").iterdir())[-1], weights_only=False)
    for name, p in model.state_dict().items():
        torch.testing.assert_close(p, state["model"][name], rtol=0, atol=0, msg=name)
    metrics = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert any("eval/l_diff" in m for m in metrics)
    assert any("eval/acc/mean" in m for m in metrics)  # task accuracy through model.generate

    # post-train the exported checkpoint: its tokenizer and mask id come with it
    again = tmp_path / "again"
    assert main(["train", str(recipe), "--init", str(final), "--output", str(again), "--no-progress",
                 "--max-steps", "1"]) == 0
    assert "step 1 (max_steps)" in capsys.readouterr().out
    assert not (again / "tokenizer").exists() and (again / "final" / "tokenizer.json").exists()


def test_bad_recipe_is_a_clean_error(tmp_path, capsys):
    recipe = tmp_path / "bad.json"
    recipe.write_text(json.dumps({"model": {"config": TINY}, "train": {"steps": 1}}))
    assert main(["train", str(recipe)]) == 2
    assert "batch_size" in capsys.readouterr().err
