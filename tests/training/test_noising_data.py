"""Noise levels and masks per block; left-padded, block-aligned batches; step-addressed datasets."""

import pytest
import torch

from clover.training.data import BatchSpec, Pair, PairDataset, blocked_response, collate
from clover.training.noising import noise_generator, sample_block_noise, step_level_bounds


def test_noise_is_per_block_seeded_and_only_on_targets():
    targets = torch.ones(64, 32, dtype=torch.bool)
    targets[:, 20:] = False  # block 2 is partly targeted, block 3 not at all
    noise = sample_block_noise(targets, 8, 0.2, noise_generator(1, 2))
    again = sample_block_noise(targets, 8, 0.2, noise_generator(1, 2))
    assert torch.equal(noise.masked, again.masked) and torch.equal(noise.levels, again.levels)
    other = sample_block_noise(targets, 8, 0.2, noise_generator(1, 3))
    assert not torch.equal(noise.masked, other.masked)
    assert not (noise.masked & ~targets).any()
    per_block = noise.masked.view(64, 4, 8).sum(-1)
    assert (per_block[:, :3] >= 1).all() and (per_block[:, 3] == 0).all()
    assert ((noise.levels[:, :3] >= 0.2) & (noise.levels[:, :3] < 1)).all()
    assert (noise.levels[:, 3] == 1).all()
    assert torch.equal(noise.per_token_levels(8)[:, 8:16], noise.levels[:, 1:2].expand(64, 8))


def test_suffix_masks_cover_a_block_from_a_cut_to_its_last_target():
    """With `suffix`, a block is masked from a drawn position to its end, with the share of its targets
    masked as its level; the share of such blocks follows `suffix`, the cut covers every position, and
    `suffix=0` draws exactly the default noise."""
    targets = torch.ones(512, 32, dtype=torch.bool)
    targets[:, 20:] = False  # block 2 has 4 targets, block 3 none
    assert torch.equal(sample_block_noise(targets, 8, 0.2, noise_generator(1, 2), 0.0).masked,
                       sample_block_noise(targets, 8, 0.2, noise_generator(1, 2)).masked)
    noise = sample_block_noise(targets, 8, 0.2, noise_generator(1, 2), 0.5)
    blocks, levels = noise.masked.view(512, 4, 8), noise.levels
    assert not (noise.masked & ~targets).any() and (blocks[:, 3] == 0).all() and (levels[:, 3] == 1).all()
    counts = targets.view(512, 4, 8).sum(-1)
    first = torch.where(blocks.any(-1), blocks.int().argmax(-1), 8)
    tail = (torch.arange(8) >= first[..., None]) & targets.view(512, 4, 8)  # from `first` to the last target
    is_tail = (blocks == tail).all(-1) & blocks.any(-1)
    suffixed = is_tail[:, :3] & torch.isclose(levels[:, :3], blocks[:, :3].sum(-1) / counts[:, :3])
    assert 0.45 < suffixed[:, :2].float().mean() < 0.62  # half chosen, plus random masks that look alike
    assert set(first[:, 1][suffixed[:, 1]].tolist()) == set(range(8))
    assert set(first[:, 2][suffixed[:, 2]].tolist()) == {0, 1, 2, 3}  # never past the last target
    with pytest.raises(ValueError, match="suffix=1.5 must be in"):
        sample_block_noise(targets, 8, 0.2, noise_generator(1, 2), 1.5)


def test_max_level_caps_the_levels_and_one_draws_the_default_noise():
    targets = torch.ones(2000, 32, dtype=torch.bool)
    default = sample_block_noise(targets, 8, 0.1, noise_generator(1, 2))
    same = sample_block_noise(targets, 8, 0.1, noise_generator(1, 2), max_level=1.0)
    assert torch.equal(default.masked, same.masked) and torch.equal(default.levels, same.levels)
    low = sample_block_noise(targets, 8, 0.1, noise_generator(1, 2), max_level=0.5)
    assert low.levels.min() >= 0.1 and low.levels.max() < 0.5 and low.levels.max() > 0.49
    assert 0.28 < low.masked.float().mean() < 0.33  # the mean level 0.3, a little more for the forced mask
    with pytest.raises(ValueError, match=r"max_level=0.1 must be in \(eps=0.1, 1\]"):
        sample_block_noise(targets, 8, 0.1, noise_generator(1, 2), max_level=0.1)


def test_max_level_share_bounds_that_share_of_blocks_and_one_draws_the_max_level_noise():
    targets = torch.ones(2000, 32, dtype=torch.bool)
    capped = sample_block_noise(targets, 8, 0.1, noise_generator(1, 2), max_level=0.5)
    same = sample_block_noise(targets, 8, 0.1, noise_generator(1, 2), max_level=0.5, max_level_share=1.0)
    assert torch.equal(capped.masked, same.masked) and torch.equal(capped.levels, same.levels)
    mixed = sample_block_noise(targets, 8, 0.1, noise_generator(1, 2), max_level=0.5, max_level_share=0.25)
    high = mixed.levels >= 0.5  # only blocks drawn from U(0.1, 1) get there: 3/4 of them, 5/9 of those
    assert 0.40 < high.float().mean() < 0.44  # expected 0.75 * 5 / 9 = 0.417 over 8000 blocks
    assert mixed.levels.min() >= 0.1 and mixed.levels.max() > 0.99
    per_row = high.float().mean(-1)  # the choice is per block, not per row: rows mix both ranges
    assert bool(((per_row > 0) & (per_row < 1)).any())
    with pytest.raises(ValueError, match=r"max_level_share=1.5 must be in \[0, 1\]"):
        sample_block_noise(targets, 8, 0.1, noise_generator(1, 2), max_level=0.5, max_level_share=1.5)


def test_step_level_bounds_spread_the_share_of_steps_evenly():
    def low_steps(share, n=12):
        bounds = [step_level_bounds(step, 0.5, share, "step") for step in range(n)]
        assert all(every_block == 1.0 for _, every_block in bounds)  # a step's blocks all alike
        return [step for step, (top, _) in enumerate(bounds) if top == 0.5]

    assert low_steps(0.5) == [1, 3, 5, 7, 9, 11]  # every other step
    assert low_steps(0.25) == [3, 7, 11] and low_steps(1.0) == list(range(12)) and low_steps(0.0) == []
    assert len(low_steps(0.75, 400)) == 300 and step_level_bounds(0, 0.5, 0.75, "step") == (1.0, 1.0)
    assert step_level_bounds(7, 0.5, 0.25, "block") == (0.5, 0.25)  # per block: the share goes on
    with pytest.raises(ValueError, match=r"share=2 must be in \[0, 1\]"):
        step_level_bounds(0, 0.5, 2, "step")
    with pytest.raises(ValueError, match=r"per='row' must be one of \('block', 'step'\)"):
        step_level_bounds(0, 0.5, 0.5, "row")


def test_mask_rate_follows_the_level():
    targets = torch.ones(4000, 32, dtype=torch.bool)
    noise = sample_block_noise(targets, 32, 0.01, noise_generator(0, 0))
    rate = noise.masked.float().mean(-1)
    expected = torch.maximum(noise.levels[:, 0], torch.full_like(rate, 1 / 32))
    assert (rate - expected).abs().mean() < 0.06
    assert noise.apply(torch.zeros(4000, 32, dtype=torch.long), 9).eq(9).equal(noise.masked)


def test_collate_left_pads_prompts_and_block_pads_responses_with_eos():
    batch = collate([Pair((5, 6, 7), (20, 21, 22, 1)), Pair((8,), (30, 31, 32, 33, 34))],
                    block_size=4, eos_id=1, pad_id=0)
    assert batch.prompt_ids.tolist() == [[5, 6, 7], [0, 0, 8]]
    assert batch.prompt_mask.tolist() == [[1, 1, 1], [0, 0, 1]]
    # row 0 already ends with EOS: one block; row 1 gets EOS appended, then padding to two blocks
    assert batch.response_ids.tolist() == [[20, 21, 22, 1, 1, 1, 1, 1], [30, 31, 32, 33, 34, 1, 1, 1]]
    assert batch.target_mask.tolist() == [[True] * 4 + [False] * 4, [True] * 8]
    assert batch.num_targets == 12 and batch.num_tokens == 16
    assert blocked_response([3, 4], 4, eos_id=1, eos_ids=(0,), max_len=1) == [3, 1, 1, 1]
    with pytest.raises(ValueError, match="non-empty prompt"):
        collate([Pair((), (1,))], 4, 1, 0)


def _pairs(n):
    return [Pair((100 + i,), tuple(range(i % 7 + 1))) for i in range(n)]


def test_dataset_is_addressed_by_step_and_sharded_by_rank():
    spec = BatchSpec(block_size=4, eos_id=1, pad_id=0)
    data = PairDataset(_pairs(50), spec, batch_size=8, seed=3)
    assert data.batches_per_epoch == 6
    epoch = [i for step in range(6) for i in data.indices(step)]
    assert len(set(epoch)) == 48  # no example twice in an epoch
    assert data.indices(6) != data.indices(0)  # a new order next epoch
    fresh = PairDataset(_pairs(50), spec, batch_size=8, seed=3)
    assert fresh.indices(13) == data.indices(13)  # no iterator state: resume by step
    whole = data.batch(4)
    halves = [data.batch(4, rank, 2) for rank in (0, 1)]
    assert torch.equal(torch.cat([h.prompt_ids for h in halves])[:, -1], whole.prompt_ids[:, -1])
    with pytest.raises(ValueError, match="divisible"):
        data.batch(0, 0, 3)


def test_group_by_length_makes_batches_of_similar_length():
    spec = BatchSpec(block_size=4, eos_id=1, pad_id=0)
    pairs = _pairs(256)
    grouped = PairDataset(pairs, spec, batch_size=8, seed=0, group_by_length=True)
    plain = PairDataset(pairs, spec, batch_size=8, seed=0)

    def spread(data):
        return sum(max(len(pairs[i].response_ids) for i in data.indices(s))
                   - min(len(pairs[i].response_ids) for i in data.indices(s)) for s in range(32))

    assert spread(grouped) < spread(plain) / 3
    assert sorted(i for s in range(32) for i in grouped.indices(s)) == list(range(256))
