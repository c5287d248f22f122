"""The error probes' `--option` (task options for their prompts) and `--checkpoint` (a trainer
checkpoint's weights, to judge a run while it trains), in `benchmarks/common.py`."""

import argparse

import pytest
import torch

from clover.training.checkpointing import save_checkpoint
from clover.training.distributed import DistInfo
from benchmark_script import load_benchmark

common = load_benchmark("common")


@pytest.fixture
def model_dir(tmp_path, model, tokenizer):
    """The tiny evaluation model and its tokenizer, saved as a checkpoint folder."""
    model.save_pretrained(tmp_path / "model")
    tokenizer.save_pretrained(tmp_path / "model")
    return str(tmp_path / "model")


def test_task_options_are_json_values():
    assert common.task_options(["balanced=true", "min_notices=4", "modifiers_last=0.5"]) == {
        "balanced": True, "min_notices": 4, "modifiers_last": 0.5}
    assert common.task_options([]) == {}


@pytest.mark.parametrize("pair", ["balanced", "=1", "min_notices=four"])
def test_a_malformed_option_is_refused_by_name(pair):
    with pytest.raises(SystemExit, match=repr(pair)):
        common.task_options([pair])


def test_checkpoint_weights_replace_the_models(tmp_path, model_dir, model):
    trained = type(model).from_pretrained(model_dir)
    with torch.no_grad():
        for p in trained.parameters():
            p.add_(0.01)
    optimizer = torch.optim.AdamW(trained.parameters())
    step = save_checkpoint(tmp_path / "run", 7, trained, optimizer, {"step": 7}, DistInfo())
    args = argparse.Namespace(model=model_dir, checkpoint=str(step), threads=1)
    path, loaded, _ = common.load_probe_model(args)
    assert path == str(step)
    for name, p in trained.state_dict().items():
        torch.testing.assert_close(loaded.state_dict()[name], p, rtol=0, atol=0, msg=name)
    plain = common.load_probe_model(argparse.Namespace(model=model_dir, checkpoint=None, threads=1))[1]
    assert not torch.equal(plain.model.embed_tokens.weight, loaded.model.embed_tokens.weight)


def test_a_checkpoint_path_without_one_is_refused_by_name(tmp_path, model_dir):
    missing = tmp_path / "run" / "checkpoints" / "step-0000400"
    args = argparse.Namespace(model=model_dir, checkpoint=str(missing), threads=1)
    with pytest.raises(FileNotFoundError, match=f"{missing}: no checkpoint here"):
        common.load_probe_model(args)
