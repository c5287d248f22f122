"""The training loop: the loss falls on a small fixed task, and a resumed run is the same run."""

import pytest
import torch

from clover.training.distributed import DistInfo
from clover.training.trainer import TrainConfig, Trainer
from tests.training.conftest import digits_dataset, digits_model


def test_loss_falls_on_digit_copy_reverse():
    config = TrainConfig(steps=60, batch_size=16, block_size=4, lr=1e-2, warmup_steps=5, alpha=1.0,
                         eps=0.05, log_interval=0, seed=0)
    trainer = Trainer(digits_model(), config, digits_dataset(16), progress=False)
    losses = [trainer.train_step() for _ in range(config.steps)]
    first = sum(s.loss for s in losses[:10]) / 10
    last = sum(s.loss for s in losses[-10:]) / 10
    first_ar = sum(s.l_ar for s in losses[:10]) / 10
    last_ar = sum(s.l_ar for s in losses[-10:]) / 10
    assert last < 0.75 * first, (first, last)  # about 5.4 -> 3.3
    assert last_ar < first_ar - 0.4, (first_ar, last_ar)  # about 2.4 -> 1.4


def _config(**kw):
    return TrainConfig(**{**dict(steps=6, batch_size=4, block_size=4, lr=5e-3, warmup_steps=2, eps=0.1,
                                 log_interval=1, seed=3), **kw})


@pytest.mark.parametrize("alpha", [1.0, 0.0])
def test_resume_is_exact(tmp_path, alpha):
    """Also AR only (alpha 0): the block-mode-only weights (the GDN's right convolution) then never get
    a gradient, so the checkpoint holds no optimizer state for them, and resuming must not ask for it."""
    straight = Trainer(digits_model(seed=1), _config(alpha=alpha), digits_dataset(4), progress=False)
    straight.train()

    first = Trainer(digits_model(seed=1), _config(alpha=alpha), digits_dataset(4), run_dir=tmp_path,
                    progress=False)
    summary = first.train(max_steps=3)
    assert summary.reason == "max_steps" and summary.step == 3 and summary.checkpoint.exists()
    rng_at_stop = torch.get_rng_state()
    torch.manual_seed(123)  # the resumed process starts from other RNG states and other weights
    second = Trainer(digits_model(seed=7), _config(alpha=alpha), digits_dataset(4), run_dir=tmp_path,
                     progress=False)
    assert second.resume()
    assert second.step == 3 and torch.equal(torch.get_rng_state(), rng_at_stop)
    assert second.train().reason == "done"

    for (name, a), (_, b) in zip(straight.model.named_parameters(), second.model.named_parameters()):
        assert torch.equal(a, b), name
    assert second.scheduler.get_last_lr() == straight.scheduler.get_last_lr()
    assert (tmp_path / "train.log").exists() and (tmp_path / "metrics.jsonl").exists()


def test_bf16_autocast_steps_run_and_keep_fp32_weights():
    trainer = Trainer(digits_model(), _config(dtype="bf16"), digits_dataset(4), progress=False)
    stats = [trainer.train_step() for _ in range(2)]
    assert all(torch.isfinite(torch.tensor([s.loss, s.grad_norm])).all() for s in stats)
    assert all(p.dtype == torch.float32 for p in trainer.model.parameters())


def test_max_level_reaches_the_training_noise(monkeypatch):
    import clover.training.trainer as trainer_module

    drawn, sample = [], trainer_module.sample_example_noise

    def recording(*args, **kwargs):
        drawn.append(sample(*args, **kwargs))
        return drawn[-1]

    def levels_per_step(steps: int, **options) -> list[torch.Tensor]:
        """The levels of the blocks with targets that `steps` training steps drew, step by step."""
        drawn.clear()
        trainer = Trainer(digits_model(), _config(**options), digits_dataset(4), progress=False)
        for _ in range(steps):
            trainer.train_step()
        return [noise.levels[noise.levels < 1] for noise in drawn]

    monkeypatch.setattr(trainer_module, "sample_example_noise", recording)
    per_step = levels_per_step(3, max_level=0.3)
    levels = torch.cat(per_step)  # blocks with targets
    assert len(per_step) == 3 and levels.numel() > 0
    assert bool(((levels >= 0.1) & (levels < 0.3)).all())
    levels = torch.cat(levels_per_step(3, max_level=0.3, max_level_share=0.5))  # about half above max_level
    assert bool((levels < 0.3).any()) and bool((levels >= 0.3).any())
    # max_level_per "step": every other step (steps 1 and 3) has only levels below max_level
    tops = [step.max().item() for step in levels_per_step(4, max_level=0.3, max_level_share=0.5, max_level_per="step")]
    assert tops[1] < 0.3 and tops[3] < 0.3 and max(tops[0], tops[2]) >= 0.3


def test_update_scales_multiply_the_first_step_where_they_say():
    """Same weights, same batch: the scaled trainer's first step is the plain one's, times the
    scale element by element (AdamW's first step does not depend on the moments' history)."""
    plain = Trainer(digits_model(seed=1), _config(), digits_dataset(4), progress=False)
    name, param = next((n, p) for n, p in plain.model.named_parameters() if p.ndim == 2)
    scale = torch.ones_like(param)
    scale[: len(scale) // 2] = 4.0
    scaled = Trainer(digits_model(seed=1), _config(), digits_dataset(4), progress=False,
                     update_scales={name: scale})
    start = param.detach().clone()
    for trainer in (plain, scaled):
        trainer.train_step()
    steps = [dict(t.model.named_parameters())[name].detach() - start for t in (plain, scaled)]
    assert steps[0].abs().sum() > 0
    torch.testing.assert_close(steps[1], steps[0] * scale, rtol=1e-4, atol=1e-8)
    for (n, a), (_, b) in zip(plain.model.named_parameters(), scaled.model.named_parameters()):
        if n != name:
            assert torch.equal(a, b), n


def test_update_scales_under_fsdp_are_refused_before_any_sharding():
    model = digits_model(seed=1)
    name = next(n for n, p in model.named_parameters() if p.ndim == 2)
    with pytest.raises(ValueError, match="update scales need whole parameters: use strategy 'ddp', not 'fsdp'"):
        Trainer(model, _config(strategy="fsdp"), digits_dataset(4), progress=False, dist=DistInfo(world_size=2),
                update_scales={name: torch.ones_like(dict(model.named_parameters())[name])})
