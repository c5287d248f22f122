"""`clover average`: the mean of checkpoint folders' and trainer checkpoints' weights, written with
the base's files; misfits and unsafe outputs refused before anything is written."""

import pytest
import torch

from clover.cli.main import main
from clover.model import CloverMoeForCausalLM
from clover.training.average import average_checkpoints
from clover.training.checkpointing import save_checkpoint
from clover.training.distributed import DistInfo
from tiny import tiny_model


@pytest.fixture
def sources(tmp_path):
    """Two checkpoint folders and a trainer checkpoint of one tiny architecture, other weights each."""
    models = [tiny_model(seed=seed) for seed in range(3)]
    folders = []
    for i, model in enumerate(models[:2]):
        model.save_pretrained(tmp_path / f"model-{i}")
        folders.append(tmp_path / f"model-{i}")
    (folders[0] / "chat_template.jinja").write_text("{{ messages }}")
    optimizer = torch.optim.AdamW(models[2].parameters())
    step = save_checkpoint(tmp_path / "run", 5, models[2], optimizer, {"step": 5}, DistInfo())
    return models, [*folders, step]


def test_the_average_is_the_mean_of_every_source(tmp_path, sources):
    models, paths = sources
    dst = average_checkpoints(paths, tmp_path / "soup")
    soup = CloverMoeForCausalLM.from_pretrained(dst).state_dict()
    for name, tensor in soup.items():
        mean = sum(m.state_dict()[name].double() for m in models) / 3
        torch.testing.assert_close(tensor.double(), mean, rtol=0, atol=1e-7, msg=name)
    assert not torch.equal(soup["model.embed_tokens.weight"], models[0].state_dict()["model.embed_tokens.weight"])
    assert (dst / "chat_template.jinja").read_text() == "{{ messages }}"
    assert (dst / "config.json").read_text() == (paths[0] / "config.json").read_text()


def test_one_source_is_returned_unchanged(tmp_path, sources):
    models, paths = sources
    soup = CloverMoeForCausalLM.from_pretrained(average_checkpoints(paths[1:2], tmp_path / "one")).state_dict()
    assert all(torch.equal(t, models[1].state_dict()[name]) for name, t in soup.items())


def test_a_misfit_is_refused_by_name_and_nothing_is_written(tmp_path, sources):
    _, paths = sources
    tiny_model(hidden_size=48).save_pretrained(tmp_path / "wider")
    with pytest.raises(ValueError, match="wider does not fit this model: .*other shapes"):
        average_checkpoints([paths[0], tmp_path / "wider"], tmp_path / "soup")
    assert not (tmp_path / "soup").exists()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".soup")] == []


def test_a_trainer_checkpoint_needs_a_base(tmp_path, sources):
    _, paths = sources
    with pytest.raises(ValueError, match="needs --base"):
        average_checkpoints([paths[2], paths[0]], tmp_path / "soup")
    assert average_checkpoints([paths[2], paths[0]], tmp_path / "soup", base=paths[0]).is_dir()


def test_an_output_that_is_no_checkpoint_is_not_replaced(tmp_path, sources):
    _, paths = sources
    keep = tmp_path / "notes"
    keep.mkdir()
    (keep / "todo.txt").write_text("mine")
    with pytest.raises(FileExistsError, match="notes is a non-empty folder that is no Clover checkpoint"):
        average_checkpoints(paths[:2], keep)
    assert [p.name for p in keep.iterdir()] == ["todo.txt"]
    average_checkpoints(paths[:2], paths[1])  # a checkpoint folder (here a source) is replaced
    assert (paths[1] / "chat_template.jinja").is_file()


def test_the_command_writes_the_average_and_refuses_bad_input_in_one_line(tmp_path, sources, capsys):
    _, paths = sources
    assert main(["average", str(tmp_path / "soup"), *map(str, paths[:2])]) == 0
    assert "the mean of 2 checkpoints' weights" in capsys.readouterr().out
    assert main(["average", str(tmp_path / "bad"), str(paths[2])]) == 2
    assert "error: base" in capsys.readouterr().err
