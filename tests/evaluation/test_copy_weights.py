"""`benchmarks/copy_weights.py`: the weight each copied token's source gets, at the best head and
at each head, on the embedded model."""

from pathlib import Path

import torch
from benchmark_script import load_benchmark

from clover import default_model_dir
from clover.training.copy_attention import copy_sources
from clover.training.data import collate
from clover.training.recipe import load_recipe
from clover.training.sources import build_tasks, task_train_examples, tokenizer_roles

probe = load_benchmark("copy_weights")
RECIPE = Path(__file__).resolve().parents[2] / "recipes" / "copy_a_cpu.json"


def test_the_best_head_s_weight_bounds_every_head_s():
    model, tokenizer = probe.model_or_trainer_checkpoint(str(default_model_dir()))
    data = load_recipe(RECIPE).data
    joint = [t for t in build_tasks(data.tasks, data.task_options) if t.name == "joint"]
    _, _, pairs = task_train_examples(tokenizer, joint, 3, 901, True, 1.0)
    roles = tokenizer_roles(tokenizer, mask_id=model.config.mask_token_id)
    batch = collate(pairs, model.config.block_size, roles.eos_id, roles.pad_id, roles.eos_ids)
    best, layers = probe.source_weights(model.eval(), batch, copy_sources(batch))
    assert best.numel() > 20 and all(layer.shape == (best.numel(), model.config.num_attention_heads)
                                     for layer in layers)
    every = torch.cat(layers, dim=1)
    assert ((every >= 0) & (every <= 1)).all()
    assert torch.equal(best, every.max(dim=1).values)


def test_a_run_prints_one_row_per_task(capsys):
    rows = probe_rows(["--examples", "2"], capsys)
    assert list(rows) == ["copy", "airspace", "joint", "record"]
    assert all(int(count) > 0 for count in rows.values())


def test_facts_prints_joint_s_fact_line_copies_alone(capsys):
    facts = probe_rows(["--examples", "2", "--facts"], capsys)
    assert list(facts) == ["joint"]
    assert 0 < int(facts["joint"]) < int(probe_rows(["--examples", "2"], capsys)["joint"])  # a part of them


def probe_rows(args, capsys) -> dict[str, str]:
    """{task: its sourced-token count} from the rows a run of the probe prints for the embedded model."""
    probe.main([str(default_model_dir()), "--recipe", str(RECIPE), *args])
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith(f"| {default_model_dir()}")]
    return {row.split("|")[2].strip(): row.split("|")[3].strip() for row in rows}
