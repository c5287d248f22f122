"""`benchmarks/check_noise_probe.py`: its rows write joint's signed checks, and its `clover` noise and
its losses are the trainer's."""

import random

import pytest
import torch

from benchmark_script import load_benchmark
from clover.training.data import Batch
from clover.training.loss import joint_loss, stream_logits
from clover.training.noising import BlockNoise, noise_generator, sample_block_noise

probe = load_benchmark("check_noise_probe")


def test_each_sign_says_whether_the_two_words_before_it_are_equal():
    ids = probe.batch(random.Random(0), 200)
    signs = ids[:, probe.SIGNS]
    assert set(signs.unique().tolist()) == {probe.PLUS, probe.MINUS}
    equal = ids[:, probe.SIGNS - 3] == ids[:, probe.SIGNS - 1]
    assert bool(((signs == probe.PLUS) == equal).all())
    assert bool((ids[:, probe.SIGNS - 2] == probe.EQUALS).all())
    assert 0.4 < equal.float().mean().item() < 0.6


def test_checks_noise_masks_only_signs_and_at_least_one_per_row():
    ids = probe.batch(random.Random(1), 64)
    masked, level = probe.block_noise(ids, "checks", 0.1, 0.0, noise_generator(0, 1))
    others = torch.ones(ids.shape[1], dtype=torch.bool)
    others[probe.SIGNS] = False
    assert not masked[:, others].any() and bool(masked.any(-1).all())
    assert bool((level == 0.5).all())


def test_clover_noise_is_the_trainers_over_the_row_after_its_first_token():
    ids = probe.batch(random.Random(2), 16)
    for suffix in (0.0, 1.0):
        masked, level = probe.block_noise(ids, "clover", 0.1, suffix, noise_generator(3, 4))
        targets = torch.ones(16, ids.shape[1] - 1, dtype=torch.bool)
        trainer = sample_block_noise(targets, ids.shape[1] - 1, 0.1, noise_generator(3, 4), suffix)
        assert not masked[:, 0].any()
        assert torch.equal(masked[:, 1:], trainer.masked) and torch.equal(level, trainer.levels)
    tail = masked[:, 1:].int()  # suffix 1.0: each row masked from a cut to its end
    assert bool((tail.diff(dim=-1) >= 0).all())
    low = probe.block_noise(ids, "clover", 0.1, 0.0, noise_generator(3, 4), max_level=0.5)
    trainer = sample_block_noise(targets, ids.shape[1] - 1, 0.1, noise_generator(3, 4), max_level=0.5)
    assert torch.equal(low[0][:, 1:], trainer.masked) and torch.equal(low[1], trainer.levels)
    mixed = probe.block_noise(ids, "clover", 0.1, 0.0, noise_generator(3, 4), 0.5, max_level_share=0.5)
    trainer = sample_block_noise(targets, ids.shape[1] - 1, 0.1, noise_generator(3, 4), max_level=0.5,
                                 max_level_share=0.5)
    assert torch.equal(mixed[0][:, 1:], trainer.masked) and torch.equal(mixed[1], trainer.levels)


def test_highest_level_is_one_before_its_start_then_ramps_to_max_level():
    assert [probe.highest_level(step, 0.5, 0, 0.1) for step in (-1, 0, 99)] == [1.0, 0.5, 0.5]
    ramp = [probe.highest_level(step, 1.0, 100, 0.1) for step in (-1, 0, 50, 100, 500)]
    assert ramp == pytest.approx([1.0, 0.2, 0.6, 1.0, 1.0])


def test_losses_and_accuracies_are_finite_and_in_range():
    model = probe.small_model(0)
    ids = probe.batch(random.Random(3), 8)
    masked, level = probe.block_noise(ids, "clover", 0.1, 0.0, noise_generator(0, 1))
    assert torch.isfinite(probe.losses(model, ids, masked, level))
    ar, block = probe.sign_accuracy(model, ids)
    assert 0.0 <= ar <= 1.0 and 0.0 <= block <= 1.0


def test_signs_only_counts_no_other_masked_token():
    model = probe.small_model(0)
    ids = probe.batch(random.Random(4), 8)
    masked = torch.zeros_like(ids, dtype=torch.bool)
    masked[:, probe.SIGNS - 1] = True  # only the words before the signs
    level = torch.full((8, 1), 0.5)
    with torch.no_grad():
        both = probe.losses(model, ids, masked, level)
        signs_only = probe.losses(model, ids, masked, level, signs_only=True)
        ar_only = probe.losses(model, ids, torch.zeros_like(masked), level)
    assert torch.allclose(signs_only, ar_only) and both > signs_only


def test_the_probes_losses_are_the_trainers_joint_loss_at_alpha_one():
    model = probe.small_model(0)
    ids = probe.batch(random.Random(5), 4)
    masked, level = probe.block_noise(ids, "clover", 0.1, 0.0, noise_generator(1, 2))
    block = ids.shape[1] - 1
    targets = torch.ones(4, block, dtype=torch.bool)
    batch = Batch(ids[:, :1], torch.ones(4, 1, dtype=torch.long), ids[:, 1:], targets)  # prompt: the first token
    noisy = ids[:, 1:].masked_fill(masked[:, 1:], model.config.mask_token_id)
    with torch.no_grad():
        logits = stream_logits(model, batch, noisy, block)
        trainer = joint_loss(logits, batch, BlockNoise(level, masked[:, 1:]), block, alpha=1.0).total
        assert torch.allclose(probe.losses(model, ids, masked, level), trainer, atol=1e-5)
