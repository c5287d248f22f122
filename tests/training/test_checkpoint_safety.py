"""Resume never unpickles: a crafted pickle in the run directory (an old-style `step-N.pt`, or a
DCP `.metadata` inside a checkpoint) is never executed; checkpoints are safetensors + JSON. A checkpoint
that lacks a parameter of the model is refused by name."""

import pickle

import pytest
import torch

from clover.training import checkpointing as ckpt
from clover.training.trainer import TrainConfig, Trainer
from tests.training.conftest import digits_dataset, digits_model


class Exploit:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):  # unpickling this would create the marker file
        return (open, (str(self.marker), "w"))


def _config():
    return TrainConfig(steps=3, batch_size=4, block_size=4, lr=5e-3, eps=0.1, log_interval=1, seed=3)


def test_crafted_pickles_are_never_loaded(tmp_path):
    marker = tmp_path / "pwned"
    run = tmp_path / "run"
    trainer = Trainer(digits_model(seed=1), _config(), digits_dataset(4), run_dir=run, progress=False)
    trainer.train(max_steps=2)
    saved = ckpt.latest_checkpoint(run)
    assert sorted(p.suffix for p in saved.iterdir()) == [".json", ".safetensors"]
    # an old-style pickled checkpoint that sorts after the real one, and a DCP pickle metadata file
    (run / "checkpoints" / "step-0000009.pt").write_bytes(pickle.dumps({"model": Exploit(marker)}))
    (saved / ".metadata").write_bytes(pickle.dumps(Exploit(marker)))

    resumed = Trainer(digits_model(seed=7), _config(), digits_dataset(4), run_dir=run, progress=False)
    assert resumed.resume() and resumed.step == 2
    assert not marker.exists()
    for (name, a), (_, b) in zip(trainer.model.named_parameters(), resumed.model.named_parameters()):
        assert torch.equal(a, b), name
    assert "pickled checkpoints of older versions are not loaded" in (run / "train.log").read_text()


def test_tied_embeddings_checkpoint_and_resume(tmp_path):
    """A model with tie_word_embeddings (shared storage) saves and resumes exactly."""
    from clover.training.data import BatchSpec, PairDataset
    from clover.training.sources import DigitTask
    from clover.training.trainer import TrainConfig, Trainer
    from tiny import tiny_model

    def trainer():
        model = tiny_model(vocab_size=16, mask_token_id=2, tie_word_embeddings=True)
        data = PairDataset(DigitTask(), BatchSpec(4, 1, 0, (1, 0)), batch_size=4)
        return Trainer(model, TrainConfig(steps=4, batch_size=4, block_size=4), data, tmp_path, progress=False)

    first = trainer()
    assert first.model.lm_head.weight is first.model.model.embed_tokens.weight
    first.train_step(), first.train_step()
    first.save()
    losses = [first.train_step().loss for _ in range(2)]
    resumed = trainer()
    assert resumed.resume() and resumed.step == 2
    assert [resumed.train_step().loss for _ in range(2)] == losses


def test_a_checkpoint_without_one_of_the_models_parameters_is_refused_by_name(tmp_path):
    run = tmp_path / "run"
    Trainer(digits_model(seed=1), _config(), digits_dataset(4), run_dir=run, progress=False).train(max_steps=1)
    model = digits_model(seed=1)
    model.register_parameter("extra", torch.nn.Parameter(torch.zeros(3)))
    resumed = Trainer(model, _config(), digits_dataset(4), run_dir=run, progress=False)
    with pytest.raises(ValueError, match="no tensor for 1 of this model's parameters, e.g. extra"):
        resumed.resume()
